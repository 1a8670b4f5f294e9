"""``commprof figures RESULTS`` and ``commprof report RESULTS``: figures, LaTeX and the PDFs.

Output folder (default ``RESULTS/report/``)::

    main.html, postmortem.html  the two reports, self-contained pages
    main.pdf, postmortem.pdf  built with latexmk + pdflatex when they are installed, in a
                              private temporary folder (``build_pdf``: no rc file read, TeX
                              paranoid); LaTeX's work files never reach this folder
    figures/<name>.pdf, .png, .svg  every figure of ``commprof.reporting.figures.FIGURES`` the
                              dataset supports (the others are not drawn; the command says why)
    tables/<name>.csv         the processed tables (``commprof.analysis.dataset.write_csv_tables``)
    quoted_<report>.json      every number the report's prose quotes: name -> text, value
    claims_<report>.json      what its sentences claim of its tables (checked against them)
    latex/                    the PDFs' LaTeX sources (``LATEX_DIR``), apart from the reports:
      main.tex, postmortem.tex  the two reports (from ``commprof.reporting.templates``)
      generated/main_body.tex   the main report's sections (``main_sections``, ``recommend``)
      generated/postmortem_body.tex  the postmortem's sections (``post_sections``)
      generated/tab_<name>.tex  booktabs fragments of the tables, for reuse

Without LaTeX the figures and LaTeX sources are still written and the command says how to get the
PDFs. Reads only the dataset folder, never a live run; imports no torch and no ray.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from commprof.analysis.dataset import Processed, process, write_csv_tables
from commprof.reporting import figures, html, main_sections, post_sections, prose, report_tables
from commprof.reporting.recommend import recommendations
from commprof.results import load

TEMPLATES = resources.files("commprof.reporting.templates")
"""The report templates (package data: present in a checkout and in an installed wheel)."""
REPORTS = ("main", "postmortem")
"""The two PDFs, by template stem."""
LATEX_DIR = "latex"
"""The report folder's subfolder of LaTeX sources (the templates and ``generated/``); the
templates find the report's ``figures/`` one level up (``\\graphicspath``)."""
LATEX_TIMEOUT_S = 300
"""Longest a latexmk run may take."""
INSTALL_HINT = (
    "apt-get install -y --no-install-recommends texlive-latex-base texlive-latex-recommended "
    "texlive-fonts-recommended latexmk"
)
"""How to get what the build needs on Debian or Ubuntu."""


def _out_dir(results_dir: Path, out_dir: Path | None) -> Path:
    return Path(out_dir) if out_dir is not None else Path(results_dir) / "report"


def _load(results_dir: Path) -> Processed | None:
    """The processed dataset, or None (and the reason on stderr) where there is none.

    A folder without committed cells (the parent ``results/`` instead of ``results/<sweep>/``,
    or any other folder) is refused rather than reported as empty placeholder figures; so is a
    dataset the processing cannot read (too few microbenchmark sizes to fit the link), in one
    line naming the folder.
    """
    try:
        tables = load(results_dir)
    except (FileNotFoundError, ValueError) as err:  # ValueError: damaged, a folder unreadable
        print(f"error: {err}", file=sys.stderr)
        return None
    if tables["cells"].empty:
        print(
            f"error: no dataset in {results_dir} (no committed cells); pass a dataset folder "
            "such as results/<sweep>/.",
            file=sys.stderr,
        )
        return None
    try:
        return process(tables)
    except ValueError as err:
        print(f"error: cannot process the dataset {results_dir}: {err}", file=sys.stderr)
        return None


def _writable(out: Path) -> bool:
    """Whether the output folder can be written (made where missing) and holds no symbolic
    link, checked before any work; where not, the reason and what to do on stderr."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".commprof-probe-"):
            pass
        link = _first_link(out)
    except OSError as err:
        print(
            f"error: cannot write to {out} ({err.strerror or err}); pass --out DIR to write the "
            "output elsewhere",
            file=sys.stderr,
        )
        return False
    if link is not None:  # a report written through it would overwrite what it points to
        print(
            f"error: {link} is a symbolic link in the output folder; the reports are never "
            "written through links: remove it, or pass --out DIR to write the output elsewhere",
            file=sys.stderr,
        )
        return False
    return True


def _first_link(out: Path) -> Path | None:
    """The first symbolic link inside ``out`` (a dataset received from others may hold one
    where a report file goes), or None."""
    for folder, dirs, files in os.walk(out):
        for name in (*dirs, *files):
            if os.path.islink(os.path.join(folder, name)):
                return Path(folder) / name
    return None


def write_figures(data: Processed, out: Path) -> list[figures.FigureResult]:
    """Figures and processed CSV tables into ``out``; prints one line per figure."""
    results = figures.make_all(data, out / "figures")
    write_csv_tables(data, out / "tables")
    for result in results:
        if result.written:
            print(f"figure {result.path}")
        else:
            print(f"figure {result.name} not drawn: {result.note}")
    return results


def figures_main(results_dir: Path, out_dir: Path | None = None) -> int:
    """Entry point of ``commprof figures RESULTS``.

    Args:
        results_dir: the dataset folder.
        out_dir: output folder (default ``RESULTS/report/``).

    Returns:
        Exit status: 0 done, 2 no dataset there (no folder, or no committed cells in it), or
        the output folder cannot be written.
    """
    out = _out_dir(results_dir, out_dir)
    data = _load(Path(results_dir))
    if data is None or not _writable(out):
        return 2
    write_figures(data, out)
    return 0


MAIN_TITLE = "commprof: gradient communication in data-parallel training"
POSTMORTEM_TITLE = "commprof engineering postmortem"


@dataclass(frozen=True, kw_only=True)
class Report:
    """One report's parts, rendered as LaTeX for the PDF and as HTML for the page: one source
    of every sentence, table and figure."""

    stem: str
    """``main`` or ``postmortem``: the file names."""
    title: str
    """The title (plain text)."""
    dataset: str
    """The dataset's name, under the title."""
    abstract: str
    """The abstract (LaTeX), or empty."""
    sections: list[prose.Section]
    """The sections, in order."""
    quotes: prose.Quotes
    """Every number (and claim) the prose quotes."""

    def latex(self) -> str:
        """The LaTeX body: title to the last section."""
        head = (
            f"\\title{{{prose.escape(self.title)}\\\\\\large dataset "
            f"\\texttt{{{prose.escape(self.dataset)}}}}}\n"
            "\\author{generated by \\texttt{commprof report}}\n\\date{}\n\\maketitle\n"
        )
        if self.abstract:
            head += "\\begin{abstract}\n" + self.abstract + "\n\\end{abstract}\n"
        return head + "\n".join(s.latex() for s in self.sections)

    def html(self, out: Path, other: tuple[str, str] | None = None) -> str:
        """The self-contained HTML page (figures read from ``out/figures``)."""
        page = html.Page(
            title=self.title,
            dataset=self.dataset,
            abstract=self.abstract,
            sections=self.sections,
            other=other,
        )
        return html.render_page(page, out)


def main_report(data: Processed, figs: set[str], dataset_name: str) -> Report:
    """The main report's parts."""
    q = prose.Quotes()
    sections = [
        main_sections.findings(data, q, figs),
        main_sections.method(data, q),
        main_sections.results(data, q, figs),
        main_sections.model_accuracy(data, q, figs),
        recommendations(data, q),
        main_sections.memory_guard(data, q, figs),
    ]
    abstract = main_sections.abstract(data, q)
    return Report(
        stem="main",
        title=MAIN_TITLE,
        dataset=dataset_name,
        abstract=abstract,
        sections=[s for s in sections if s is not None],
        quotes=q,
    )


def postmortem_report(data: Processed, figs: set[str], dataset_name: str) -> Report:
    """The postmortem's parts."""
    q = prose.Quotes()
    sections = [
        post_sections.what_ran(data, q),
        post_sections.failures(data),
        post_sections.repeatability(data, q),
        post_sections.instrumentation(data, q, figs),
        post_sections.environment(data, q),
        post_sections.limitations(data, q),
    ]
    return Report(
        stem="postmortem",
        title=POSTMORTEM_TITLE,
        dataset=dataset_name,
        abstract="",
        sections=[s for s in sections if s is not None],
        quotes=q,
    )


def main_body(data: Processed, figs: set[str], dataset_name: str) -> tuple[str, prose.Quotes]:
    """The main report's LaTeX body (title to last section) and the numbers it quotes."""
    report = main_report(data, figs, dataset_name)
    return report.latex(), report.quotes


def postmortem_body(data: Processed, figs: set[str], dataset_name: str) -> tuple[str, prose.Quotes]:
    """The postmortem's LaTeX body and the numbers it quotes."""
    report = postmortem_report(data, figs, dataset_name)
    return report.latex(), report.quotes


def make_reports(data: Processed, figs: set[str], dataset_name: str) -> list[Report]:
    """Both reports' parts, main first."""
    return [
        main_report(data, figs, dataset_name),
        postmortem_report(data, figs, dataset_name),
    ]


def write_latex(data: Processed, out: Path, figs: set[str], dataset_name: str) -> list[Report]:
    """The two report bodies, their quoted numbers and claims, the table fragments and the
    templates (the LaTeX under ``out / LATEX_DIR``); returns the reports' parts."""
    latex = out / LATEX_DIR
    generated = latex / "generated"
    generated.mkdir(parents=True, exist_ok=True)
    reports = make_reports(data, figs, dataset_name)
    for report in reports:
        (generated / f"{report.stem}_body.tex").write_text(report.latex(), encoding="ascii")
        report.quotes.write(out / f"quoted_{report.stem}.json")
        report.quotes.write_claims(out / f"claims_{report.stem}.json")
    report_tables.write_latex_tables(data, generated)
    for stem in REPORTS:
        (latex / f"{stem}.tex").write_bytes(TEMPLATES.joinpath(f"{stem}.tex").read_bytes())
    return reports


def write_html(reports: list[Report], out: Path) -> list[Path]:
    """Each report as ``<stem>.html`` in ``out``, linked to the other; returns the pages."""
    paths = []
    for report in reports:
        other = next((r for r in reports if r is not report), None)
        link = (f"{other.stem}.html", other.title) if other is not None else None
        path = out / f"{report.stem}.html"
        path.write_text(report.html(out, link), encoding="utf-8")
        paths.append(path)
    return paths


def latex_available() -> bool:
    """Whether latexmk and pdflatex are on PATH."""
    return shutil.which("latexmk") is not None and shutil.which("pdflatex") is not None


LATEX_ENV = {"openin_any": "p", "openout_any": "p", "shell_escape": "f"}
"""TeX's settings for the build (kpathsea reads them from the environment): paranoid reading
and writing (no dot files, no absolute paths, no ``..``) and no shell escape."""


def _latex_env(home: Path) -> dict[str, str]:
    """The environment of a LaTeX build: the caller's PATH and locale, TeX paranoid
    (:data:`LATEX_ENV`), and a HOME of the build's own so that no per-user TeX tree or rc file
    of the caller's is read either."""
    keep = ("PATH", "LANG", "LC_ALL", "TEXMFCNF", "TEXMFDIST", "TEXMFMAIN", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update(LATEX_ENV)
    env.update(HOME=str(home), TEXMFHOME=str(home / "texmf"), TEXMFVAR=str(home / "texmf-var"))
    env["TEXMFCONFIG"] = str(home / "texmf-config")
    return env


def _stage(generated: Path, figures: Path, stem: str, build: Path) -> Path:
    """Copy what ``stem``'s PDF needs (the template, the generated bodies and tables, the
    figures' PDFs) into the private build folder; returns the staged .tex file.

    Only regular files of the names the report writes are copied, so nothing else that sits
    in the report's folders (an rc file, a symlink) reaches the build.
    """
    tex = build / f"{stem}.tex"
    tex.write_bytes(TEMPLATES.joinpath(f"{stem}.tex").read_bytes())
    for src_dir, sub, pattern in ((generated, "generated", "*.tex"), (figures, "figures", "*.pdf")):
        (build / sub).mkdir()
        for src in sorted(src_dir.glob(pattern)):
            if src.is_file() and not src.is_symlink():
                shutil.copyfile(src, build / sub / src.name)
    return tex


def build_pdf(tex: Path, dest: Path | None = None, figures: Path | None = None) -> tuple[bool, str]:
    """Build one PDF with latexmk and pdflatex in a fresh private folder; copy the PDF alone
    next to ``tex`` (or into ``dest``).

    Reading a dataset never runs its code: the build runs in a new ``mkdtemp`` folder (mode
    0700) holding only the files the report needs (:func:`_stage`), latexmk reads no rc file
    (``-norc``), TeX runs paranoid without shell escape (:func:`_latex_env`), and LaTeX's work
    files (``.aux .log .fls .fdb_latexmk .out``) stay in that folder, which is removed after.

    Args:
        tex: the .tex file (next to ``generated/``: the report folder's ``LATEX_DIR``).
        dest: the folder the PDF is copied into (default ``tex``'s folder).
        figures: the folder of the figures' PDFs (default ``figures/`` next to ``tex``).

    Returns:
        (success, LaTeX's log: the whole of it on success, for a caller to check it for
        overfull boxes or undefined references; its last 30 lines, or latexmk's output where
        there is no log, on failure).
    """
    dest = tex.parent if dest is None else dest
    with tempfile.TemporaryDirectory(prefix="commprof-latex-") as tmp:
        build = Path(tmp)
        home = build / "home"
        home.mkdir()
        work = build / "work"
        work.mkdir()
        figures = tex.parent / "figures" if figures is None else figures
        staged = _stage(tex.parent / "generated", figures, tex.stem, work)
        cmd = ["latexmk", "-norc", "-pdf", "-interaction=nonstopmode", "-halt-on-error"]
        try:
            proc = subprocess.run(
                [*cmd, staged.name],
                cwd=work,
                env=_latex_env(home),
                capture_output=True,
                text=True,
                timeout=LATEX_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, f"latexmk took more than {LATEX_TIMEOUT_S} s on {tex}"
        pdf = staged.with_suffix(".pdf")
        if proc.returncode != 0 or not pdf.is_file():
            log = staged.with_suffix(".log")
            text = log.read_text(errors="replace") if log.is_file() else proc.stdout + proc.stderr
            return False, "\n".join(text.splitlines()[-30:])
        log = staged.with_suffix(".log")
        text = log.read_text(errors="replace") if log.is_file() else ""
        target = dest / pdf.name
        part = dest / f".{pdf.name}.part"
        part.unlink(missing_ok=True)  # a link planted there is removed, never followed
        shutil.copyfile(pdf, part)
        os.replace(part, target)
    return True, text


PDF_CHOICES = ("auto", "yes", "no")
"""``--pdf``: build the PDFs where LaTeX is installed (``auto``), insist on them (``yes``: no
LaTeX is an error), or write the HTML alone (``no``)."""


def report_main(results_dir: Path, out_dir: Path | None = None, *, pdf: str = "auto") -> int:
    """Entry point of ``commprof report RESULTS``: figures, the HTML reports, and the PDFs.

    Args:
        results_dir: the dataset folder.
        out_dir: output folder (default ``RESULTS/report/``).
        pdf: one of :data:`PDF_CHOICES`.

    Returns:
        Exit status: 0 every report asked for was written (the HTML always; the PDFs too where
        LaTeX is installed, or said missing under ``auto``), 1 a report asked for was not
        written (a PDF failed to build, or ``--pdf yes`` without LaTeX), 2 no dataset there
        (no folder, or no committed cells in it), or the output folder cannot be written.
    """
    results_dir = Path(results_dir)
    out = _out_dir(results_dir, out_dir)
    data = _load(results_dir)
    if data is None or not _writable(out):
        return 2
    return build_reports(data, out, results_dir.resolve().name, pdf=pdf)


def build_reports(
    data: Processed,
    out: Path,
    dataset_name: str,
    *,
    pdf: str = "auto",
    logs: dict[str, str] | None = None,
) -> int:
    """Figures, LaTeX, the HTML pages and the PDFs of a processed dataset into ``out``.

    Args:
        data: the processed dataset.
        out: the output folder.
        dataset_name: the name the reports' titles give the dataset.
        pdf: one of :data:`PDF_CHOICES`.
        logs: where given, filled with each PDF built's LaTeX log by report stem
            (:func:`build_pdf`'s); the log itself never reaches ``out``.

    Returns:
        Exit status as :func:`report_main`'s (0 or 1).
    """
    if pdf not in PDF_CHOICES:
        raise ValueError(f"pdf={pdf!r}: use one of {', '.join(PDF_CHOICES)}")
    results = write_figures(data, out)
    reports = write_latex(data, out, {r.name for r in results if r.written}, dataset_name)
    pages = write_html(reports, out)
    for page in pages:
        print(f"report {page}")
    if pdf == "no":
        return 0
    if not latex_available():
        print(
            f"LaTeX not found: no PDFs (the HTML reports above are complete; open "
            f"{pages[0]} in a browser). For the PDFs install TeX Live ({INSTALL_HINT}) and "
            f"rerun, or run `latexmk -norc -pdf main.tex postmortem.tex` in {out / LATEX_DIR}.",
            file=sys.stderr,
        )
        return 1 if pdf == "yes" else 0
    status = 0
    for stem in REPORTS:
        ok, log = build_pdf(out / LATEX_DIR / f"{stem}.tex", dest=out, figures=out / "figures")
        if logs is not None:
            logs[stem] = log
        if ok:
            print(f"report {out / (stem + '.pdf')}")
        else:
            print(f"error: building {stem}.pdf failed:\n{log}", file=sys.stderr)
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m commprof.reporting.build report|figures RESULTS [--out DIR]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m commprof.reporting.build")
    parser.add_argument("what", choices=("report", "figures"))
    parser.add_argument("results", type=Path, help="dataset folder")
    parser.add_argument("--out", type=Path, help="output folder (default RESULTS/report/)")
    parser.add_argument("--pdf", choices=PDF_CHOICES, default="auto", help="report: PDFs too")
    args = parser.parse_args(argv)
    if args.what == "report":
        return report_main(args.results, args.out, pdf=args.pdf)
    return figures_main(args.results, args.out)


if __name__ == "__main__":
    sys.exit(main())
