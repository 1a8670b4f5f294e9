"""Building blocks of the generated report text: quoted numbers, sections, figures, tables.

Every section of the two reports is a function of the processed dataset that returns a
:class:`Section` (or None where the dataset does not support it). A number enters the prose only
through :meth:`Quotes.num` (or its shorthands), which formats it and records its name, its
printed text and its value; the record is written as ``quoted.json`` beside the reports, so a
test can parse every quoted number back and recompute it from the dataset. A quote of a value
that is not finite is a bug in the section that asked for it (a sentence must not exist where
its number does not) and raises. This module imports no torch and no ray.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commprof.caps import cap_label, cap_mb

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""A terminal colour or cursor sequence, as Ray's and other logs put in error texts."""

_ASCII_FOR = {"\u2013": "--", "\u2014": "---", "\u00d7": "x", "\u2264": "<=", "\u2265": ">="}
"""Characters whose compatibility decomposition has no ASCII, spelled in ASCII."""


def _ascii(ch: str) -> str:
    """One character as ASCII: itself, its unaccented letters, a spelling, nothing or ``?``."""
    if ch.isascii():
        return ch if ch.isprintable() or ch in "\n\t" else ""
    if ch in _ASCII_FOR:
        return _ASCII_FOR[ch]
    folded = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    if folded:
        return folded
    return "" if unicodedata.category(ch) in ("Mn", "Me", "Cf") else "?"


def escape(text: object) -> str:
    """Text as LaTeX: ASCII only, with LaTeX's special characters escaped.

    Text from outside (an error message, a path, a model name) may hold any character: a
    terminal colour sequence is dropped, an accented letter loses its accent, a few symbols are
    spelled out and anything else (an emoji in gloo's error text) prints as ``?``; the report is
    written as ASCII and pdflatex reads it so.
    """
    plain = "".join(_ascii(ch) for ch in _ANSI.sub("", str(text)))
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in plain)


def words(items: Iterable[object], *, conjunction: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c`` (items already LaTeX)."""
    texts = [str(i) for i in items]
    if len(texts) <= 1:
        return "".join(texts)
    return ", ".join(texts[:-1]) + f" {conjunction} " + texts[-1]


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``1 cell``, ``2 cells`` (the count not quoted: use for structural counts only)."""
    return singular if count == 1 else (plural_form or singular + "s")


@dataclass(frozen=True, kw_only=True, slots=True)
class Quote:
    """One number the prose prints."""

    text: str
    """As printed (LaTeX-free: digits, commas, a point, a sign)."""
    value: float
    """The value it was formatted from, in the unit printed."""


CLAIM_KINDS = {
    "config": "a configuration named in the prose is a row of table ``table`` (model, world "
    "size, cap, profiled or not)",
    "configs_count": "the prose counts ``count`` rows of table ``table`` (``profiled``: only "
    "rows with that mark; absent: all)",
    "fastest_cap": "among the unprofiled rows of ``table`` for (model, world size), ``cap`` has "
    "the shortest median step",
    "no_multi_cap": "no (model, world size) has two unprofiled rows of ``table`` or more",
    "ran": "the models, world sizes and caps the prose lists are those of the rows of ``table``",
    "most_overlap": "the configuration has the largest overlap efficiency of ``table``",
}
"""What each kind of claim asserts about a table of the same report (``Quotes.claim``)."""


class Quotes:
    """The registry of quoted numbers of one report (name -> :class:`Quote`), and of its claims
    about which configurations ran (:meth:`claim`)."""

    def __init__(self) -> None:
        self._quotes: dict[str, Quote] = {}
        self._claims: list[dict[str, object]] = []

    def num(self, name: str, value: float, digits: int = 1) -> str:
        """Format ``value`` with ``digits`` decimals and commas, and record it as ``name``.

        Args:
            name: a key unique in the report; quoting the same name again must give the same
                text (the same number said in two places).
            value: a finite number.
            digits: decimals.

        Returns:
            The text to put in the prose.

        Raises:
            ValueError: a non-finite value, or a name quoted before with another text.
        """
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"quote {name!r} is {value}: a sentence needs a finite number")
        text = f"{value:,.{digits}f}"
        if re.fullmatch(r"-0(\.0*)?", text):  # -0.0 rounds to zero: no sign
            text = text[1:]
        old = self._quotes.get(name)
        if old is not None and old.text != text:
            raise ValueError(f"quote {name!r} printed as {old.text} and as {text}")
        self._quotes[name] = Quote(text=text, value=value)
        return text

    def count(self, name: str, value: int) -> str:
        """An integer count (no decimals)."""
        return self.num(name, value, 0)

    def ms(self, name: str, value_ns: float, digits: int = 2) -> str:
        """Nanoseconds printed as milliseconds."""
        return self.num(name, value_ns / 1e6, digits)

    def pct(self, name: str, fraction: float, digits: int = 1) -> str:
        """A fraction printed as a percentage (without the sign: the prose adds ``\\%``)."""
        return self.num(name, 100.0 * fraction, digits)

    def claim(self, kind: str, **fields: object) -> None:
        """Record a claim of the prose about the rows of a table of the same report.

        A sentence that names a configuration, counts configurations or says which cap was
        fastest records it here, computed from the same frame the table prints; the report
        tests check every claim against the printed tables (``claims_<report>.json``).

        Args:
            kind: one of :data:`CLAIM_KINDS`.
            fields: JSON-able values: ``table`` (the label suffix, ``results``) and the kind's
                own (``model``, ``world_size``, ``cap`` in MiB or None for DDP's default,
                ``profiled``, ``count``, ``models``, ``world_sizes``, ``caps``).
        """
        if kind not in CLAIM_KINDS:
            raise ValueError(f"claim kind {kind!r} is not one of {sorted(CLAIM_KINDS)}")
        if "table" not in fields:
            raise ValueError(f"claim {kind!r} names no table")
        record = {"kind": kind, **fields}
        json.dumps(record)  # plain values only
        if record not in self._claims:
            self._claims.append(record)

    @property
    def claims(self) -> list[dict[str, object]]:
        """The claims recorded, in order."""
        return list(self._claims)

    def write_claims(self, path: Path) -> None:
        """Write the claims as JSON (a list)."""
        path.write_text(json.dumps(self._claims, indent=1) + "\n", encoding="ascii")

    def as_dict(self) -> dict[str, dict[str, float | str]]:
        """Name -> {"text", "value"}."""
        return {k: {"text": q.text, "value": q.value} for k, q in self._quotes.items()}

    def write(self, path: Path) -> None:
        """Write the registry as JSON."""
        path.write_text(json.dumps(self.as_dict(), indent=1) + "\n", encoding="ascii")


@dataclass(kw_only=True, slots=True)
class Section:
    """One section of a report, as LaTeX."""

    title: str
    """Section title (LaTeX)."""
    body: str
    """Paragraphs, figures and tables (LaTeX)."""
    label: str = ""
    """``\\label`` name (``sec:<label>``), or empty."""
    floats: list[str] = field(default_factory=list)
    """Figure and table environments placed after the body."""

    def latex(self) -> str:
        """The section as LaTeX."""
        label = rf"\label{{sec:{self.label}}}" if self.label else ""
        parts = [rf"\section{{{self.title}}}{label}", self.body.strip(), *self.floats]
        return "\n\n".join(p for p in parts if p) + "\n"


def config_label(r: Any) -> str:
    """``model, p=N, cap X MiB`` (``, profiled`` where it was), escaped for LaTeX; the cap never
    breaks across lines."""
    cap = escape(cap_label(r.bucket_cap_mb)).replace(" ", "~")
    text = f"{escape(r.model)}, p={int(r.world_size)}, cap {cap}"
    return text + (", profiled" if bool(getattr(r, "profile", False)) else "")


def named(q: Quotes, r: Any, table: str) -> str:
    """:func:`config_label` of a row, recorded as a claim that ``table`` of the same report
    prints that configuration (``Quotes.claim``, kind ``config``)."""
    cap = cap_mb(r.bucket_cap_mb)
    q.claim(
        "config",
        table=table,
        model=str(r.model),
        world_size=int(r.world_size),
        cap=cap,
        profiled=bool(getattr(r, "profile", False)),
    )
    return config_label(r)


def paragraph(sentences: Sequence[str]) -> str:
    """Sentences joined into one paragraph (empty ones dropped)."""
    return " ".join(s.strip() for s in sentences if s and s.strip())


def figure(name: str, caption: str) -> str:
    """A figure environment for ``figures/<name>.pdf`` labelled ``fig:<name>``."""
    return (
        "\\begin{figure}[!htbp]\\centering\n"
        f"\\includegraphics[width=\\linewidth]{{figures/{name}.pdf}}\n"
        f"\\caption{{{caption}}}\\label{{fig:{name}}}\n\\end{{figure}}"
    )


LONG_CAPTION = "%caption%"
"""Where :func:`table` puts a long table's caption and label (``report_tables.booktabs``)."""


def table(name: str, caption: str, fragment: str, *, here: bool = False) -> str:
    """A table environment holding a generated fragment, labelled ``tab:<name>``.

    Args:
        name: label suffix.
        caption: the caption (LaTeX).
        fragment: the ``tabular`` fragment.
        here: pin the table where it is (``[H]``): for a short table that must stay in its
            section rather than float past the next one. A ``longtable`` fragment (a long
            table, ``report_tables.LONG_ROWS``) is not a float: it stays where it is and breaks
            across pages.
    """
    label = f"\\caption{{{caption}}}\\label{{tab:{name}}}"
    if "\\begin{longtable}" in fragment:  # breaks across pages: caption inside, no float
        return fragment.rstrip().replace(LONG_CAPTION, label + r" \\", 1)
    where = "H" if here else "!htbp"
    return f"\\begin{{table}}[{where}]\\centering\n{label}\n{fragment.rstrip()}\n\\end{{table}}"
