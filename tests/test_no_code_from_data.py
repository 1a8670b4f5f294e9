"""Reading a dataset never runs its code: the report builds with no rc file of the dataset
folder (or of the folder the command runs in) read by latexmk, TeX or matplotlib."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from commprof.reporting import build
from tests.prereqs import needs

DATA = Path(__file__).parent / "data" / "results_smoke"
COMMPROF = Path(sys.executable).parent / "commprof"
"""The installed command (not ``python -m``, which would put the current folder on sys.path)."""


def _plant(folder: Path, markers: Path) -> list[Path]:
    """Every rc file latexmk, TeX and matplotlib read from a folder, in ``folder``; each one that
    is read leaves a marker file in ``markers`` (latexmk) or turns the figures red
    (matplotlib) or breaks the build (TeX). Returns the markers the rc files would write."""
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for name in ("latexmkrc", ".latexmkrc"):
        marker = markers / f"{folder.name}-{name.lstrip('.')}-ran"
        (folder / name).write_text(f'system("touch {marker}");\n$pdflatex = "false";\n')
        made.append(marker)
    (folder / "texmf.cnf").write_text("TEXINPUTS = /nonexistent//\nshell_escape = t\n")
    (folder / "matplotlibrc").write_text("figure.facecolor: ff0000\nsavefig.facecolor: ff0000\n")
    return made


def test_latex_runs_paranoid_in_a_clean_home(tmp_path: Path) -> None:
    env = build._latex_env(tmp_path)
    assert env["openin_any"] == "p" and env["openout_any"] == "p" and env["shell_escape"] == "f"
    assert env["HOME"] == str(tmp_path) and env["TEXMFHOME"].startswith(str(tmp_path))


@needs(tool="latexmk")
@needs(tool="pdflatex")
@pytest.mark.slow
def test_report_reads_no_rc_file_of_the_dataset(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(DATA, ds)
    markers = tmp_path / "markers"
    markers.mkdir()
    planted = _plant(ds, markers) + _plant(ds / "report", markers)
    before = {p.name for p in (ds / "report").iterdir()}
    proc = subprocess.run(
        [str(COMMPROF), "report", ".", "--pdf", "yes"],
        cwd=ds,  # the folder the user runs in is the dataset: its rc files are there too
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for marker in planted:
        assert not marker.exists(), f"{marker.name}: a planted latexmkrc ran"
    report = ds / "report"
    for stem in build.REPORTS:
        assert (report / f"{stem}.pdf").stat().st_size > 0  # TeX ignored texmf.cnf
    # LaTeX's work files stay in the private build folder (issue #45)
    left = {p.name for p in report.iterdir()} - before
    work = {n for n in left if n.endswith((".aux", ".log", ".fls", ".fdb_latexmk", ".out"))}
    assert not work, work
    # matplotlib drew with its own defaults: the figure's corner is white, not the planted red
    import matplotlib.image

    png = next((report / "figures").glob("*.png"))
    r, g, b = matplotlib.image.imread(png)[0, 0][:3]
    assert (r, g, b) == (1.0, 1.0, 1.0), (png.name, r, g, b)


@needs(tool="latexmk")
@pytest.mark.slow
def test_build_folder_is_private_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Path, int]] = []
    real = build._stage

    def spy(generated: Path, figures: Path, stem: str, work: Path) -> Path:
        seen.append((work.parent, stat.S_IMODE(os.stat(work.parent).st_mode)))
        return real(generated, figures, stem, work)

    monkeypatch.setattr(build, "_stage", spy)
    (tmp_path / "generated").mkdir()
    (tmp_path / "figures").mkdir()
    (tmp_path / "generated" / "postmortem_body.tex").write_text("Hello.\n", encoding="ascii")
    (tmp_path / "latexmkrc").write_text(f'system("touch {tmp_path / "ran"}");\n')
    ok, log = build.build_pdf(tmp_path / "postmortem.tex")
    assert ok, log
    assert (tmp_path / "postmortem.pdf").is_file() and not (tmp_path / "ran").exists()
    assert seen and seen[0][1] == 0o700 and not seen[0][0].exists()


def test_a_link_in_the_report_folder_is_never_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    ds = tmp_path / "ds"
    shutil.copytree(DATA, ds)
    (ds / "report").mkdir()
    os.symlink(victim, ds / "report" / "main.html")  # planted where a report goes
    assert build.report_main(ds, pdf="no") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "main.html is a symbolic link" in err[0], err
    assert victim.read_text() == "mine"
