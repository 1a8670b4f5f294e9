"""The reports as self-contained HTML pages, rendered from the same section objects as the PDFs.

Every section function returns a :class:`prose.Section` whose title, body and floats are the
LaTeX the PDF build reads; :mod:`commprof.reporting.latex_html` renders that LaTeX, so each
sentence, table and figure has one source and the page and the PDF cannot drift apart. The page
needs no network: figures are SVG data URIs, the style sheet (``templates/report.css``) and a
few lines of script that sort a table by the column clicked (``templates/report.js``) are
inlined. This module imports no torch and no ray.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from commprof.reporting.latex_html import LaTeXToHTML, Numbers, anchor_of
from commprof.reporting.prose import Section

TEMPLATES = resources.files("commprof.reporting.templates")
"""The style sheet and the script (package data)."""


def number_labels(latex_parts: Sequence[str], numbers: Numbers) -> None:
    """Number every ``\\label`` of the report in order, per kind, as LaTeX would: a section by
    its ``\\section``, a table or figure by its ``\\caption``."""
    for part in latex_parts:
        for match in re.finditer(r"\\label\{((sec|tab|fig):[^}]*)\}", part):
            numbers.add(match.group(1))


@dataclass(frozen=True, kw_only=True, slots=True)
class Page:
    """One report as the HTML page renders it."""

    title: str
    """The report's title (plain text)."""
    dataset: str
    """The dataset's name, under the title."""
    abstract: str
    """The abstract (LaTeX), or empty."""
    sections: Sequence[Section]
    """The sections, in order."""
    other: tuple[str, str] | None = None
    """(file name, title) of the companion report, linked under the title."""


def render_page(page: Page, figures_dir: Path) -> str:
    """The complete, self-contained HTML document of one report.

    Args:
        page: the report's parts.
        figures_dir: the report's output folder (``figures/<name>.svg`` below it).

    Returns:
        The page.
    """
    numbers = Numbers()
    for n, section in enumerate(page.sections, start=1):
        key = f"sec:{section.label}" if section.label else f"sec:#{n}"
        numbers.add(key)
    number_labels([fl for s in page.sections for fl in s.floats], numbers)
    to_html = LaTeXToHTML(numbers, figures_dir)
    body = [f"<h1>{html.escape(page.title)}</h1>"]
    body.append(f'<p class="dataset">dataset <code>{html.escape(page.dataset)}</code></p>')
    if page.other is not None:
        href, name = page.other
        body.append(f'<p class="other">See also: <a href="{href}">{html.escape(name)}</a></p>')
    if page.abstract:
        body.append(f'<div class="abstract"><h2>Abstract</h2>{to_html.render(page.abstract)}</div>')
    for n, section in enumerate(page.sections, start=1):
        anchor = anchor_of(f"sec:{section.label}") if section.label else f"sec-{n}"
        title = to_html.inline(section.title)
        body.append(f'<section id="{anchor}"><h2>{n}&ensp;{title}</h2>')
        body.append(to_html.render(section.body))
        for fl in section.floats:
            body.append(to_html.render(fl))
        body.append("</section>")
    return _document(html.escape(page.title), "\n".join(body))


def _document(title: str, body: str) -> str:
    style = TEMPLATES.joinpath("report.css").read_text(encoding="utf-8")
    script = TEMPLATES.joinpath("report.js").read_text(encoding="utf-8")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{title}</title>\n<style>\n{style}</style>\n</head>\n<body>\n{body}\n"
        f"<script>\n{script}</script>\n</body>\n</html>\n"
    )
