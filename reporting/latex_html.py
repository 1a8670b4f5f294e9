"""LaTeX of the report sections as HTML: the renderer behind ``commprof.reporting.html``.

Every section function returns a :class:`prose.Section` whose title, body and floats are the
LaTeX that the PDF build reads. This module renders that LaTeX, so each sentence, table and
figure has one source and the HTML and the PDF cannot drift apart. It knows the subset of LaTeX
the sections write (``LaTeXToHTML``): text with its escapes, ``\\texttt``, ``\\emph``,
``\\textbf``, ``\\paragraph``, references, inline math, lists, booktabs tables (``tabular``,
``tabularx``, ``longtable``; ``\\multicolumn`` and ``\\cmidrule`` included) and figures. A
command or environment outside the subset raises :class:`UnknownLatex` naming it, so a section
that starts to write one fails the report tests instead of printing raw LaTeX.

Figures are inlined as SVG data URIs (``figures/<name>.svg``, written beside each PDF).
Numbering follows LaTeX's: sections, tables and figures each counted in order of appearance
(:func:`number_labels`). This module imports no torch and no ray.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class UnknownLatex(ValueError):
    """A section wrote LaTeX this renderer does not know; the message names it."""


TEXT_COMMANDS = {"texttt": "code", "emph": "em", "textbf": "strong"}
"""Commands with one argument rendered as an HTML element."""
SYMBOLS = {
    "%": "%",
    "&": "&amp;",
    "$": "$",
    "#": "#",
    "_": "_",
    "{": "{",
    "}": "}",
    ",": "&thinsp;",
    " ": " ",
    "textbackslash": "\\",
    "textasciitilde": "~",
    "textasciicircum": "^",
    "textless": "&lt;",
    "textgreater": "&gt;",
    "alpha": "&alpha;",
    "beta": "&beta;",
    "gamma": "&gamma;",
    "mu": "&mu;",
    "dagger": "&dagger;",
    "cdot": "&middot;",
    "times": "&times;",
    "le": "&le;",
    "leq": "&le;",
    "ge": "&ge;",
    "geq": "&ge;",
    "approx": "&asymp;",
    "pm": "&plusmn;",
    "infty": "&infin;",
    "max": "max",
    "min": "min",
    "log": "log",
    "lg": "lg",
    "ldots": "&hellip;",
    "dots": "&hellip;",
}
"""Commands without arguments that stand for one character or word."""
IGNORED = {
    "small",
    "footnotesize",
    "scriptsize",
    "normalsize",
    "large",
    "centering",
    "raggedright",
    "arraybackslash",
    "begingroup",
    "endgroup",
    "noindent",
    "toprule",
    "bottomrule",
    "maketitle",
}
"""Layout commands without an HTML meaning (sizes, alignment, groups)."""
LISTS = {"itemize": "ul", "enumerate": "ol", "description": "dl"}
"""List environments and their HTML elements."""
TABULARS = ("tabular", "tabularx", "longtable")
"""Table environments (booktabs fragments, ``report_tables.booktabs``)."""
KINDS = {"sec": "Section", "tab": "Table", "fig": "Figure"}
"""Label prefixes and what LaTeX calls them."""


@dataclass(kw_only=True, slots=True)
class Numbers:
    """LaTeX's numbering of one report: label -> number, counted per kind in order."""

    by_label: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, label: str) -> int:
        """Number ``label`` (``tab:x``) as the next of its kind; the same number if seen."""
        if label not in self.by_label:
            kind = label.partition(":")[0]
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.by_label[label] = self.counts[kind]
        return self.by_label[label]


_TOKEN = re.compile(
    r"(?P<cmd>\\(?:[A-Za-z]+\*?|.))|(?P<open>\{)|(?P<close>\})|(?P<math>\$)|(?P<amp>&)"
    r"|(?P<tilde>~)|(?P<par>\n[ \t]*\n\s*)|(?P<text>[^\\{}$&~\n]+|\n)",
    re.S,
)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    value: str


def tokens(latex: str) -> list[Token]:
    """The fragment as tokens (commands, braces, math shifts, ``&``, ``~``, paragraph breaks,
    text)."""
    out = []
    for match in _TOKEN.finditer(latex):
        kind = match.lastgroup
        assert kind is not None
        out.append(Token(kind, match.group()))
    return out


def _text(raw: str) -> str:
    """Plain LaTeX text as HTML: escaped, ``---`` and ``--`` as dashes, line ends as spaces."""
    escaped = html.escape(raw.replace("\n", " "), quote=False)
    return escaped.replace("---", "&mdash;").replace("--", "&ndash;")


class LaTeXToHTML:
    """Renders one LaTeX fragment of a report (see the module docstring).

    Args:
        numbers: the report's numbering (filled by :meth:`number_labels` beforehand).
        figures_dir: where ``figures/<name>.svg`` are (the report's output folder).
    """

    def __init__(self, numbers: Numbers, figures_dir: Path) -> None:
        self.numbers = numbers
        self.figures_dir = figures_dir
        self._toks: list[Token] = []
        self._i = 0
        self._pending: tuple[str, str] | None = None
        """(caption HTML, anchor) of the table float being rendered, for its tabular."""

    # -- token stream ------------------------------------------------------------------------

    def _peek(self) -> Token | None:
        return self._toks[self._i] if self._i < len(self._toks) else None

    def _next(self) -> Token:
        tok = self._peek()
        if tok is None:
            raise UnknownLatex("the fragment ends inside a group or an environment")
        self._i += 1
        return tok

    def _skip_space(self) -> None:
        while (tok := self._peek()) is not None and tok.kind == "text" and not tok.value.strip():
            self._i += 1

    def _raw_group(self) -> str:
        """The raw LaTeX of the next ``{...}`` group (braces balanced), without its braces."""
        self._skip_space()
        tok = self._next()
        if tok.kind != "open":
            raise UnknownLatex(f"expected '{{', got {tok.value!r}")
        depth, parts = 1, list[str]()
        while True:
            tok = self._next()
            depth += {"open": 1, "close": -1}.get(tok.kind, 0)
            if depth == 0:
                return "".join(parts)
            parts.append(tok.value)

    def _optional(self) -> str:
        """The raw LaTeX of an optional ``[...]`` argument right here (empty where none)."""
        tok = self._peek()
        if tok is None or tok.kind != "text" or not tok.value.startswith("["):
            return ""
        depth, parts = 0, []
        while True:
            tok = self._next()
            if tok.kind != "text":
                parts.append(tok.value)
                continue
            for n, ch in enumerate(tok.value):
                depth += {"[": 1, "]": -1}.get(ch, 0)
                if depth == 0:
                    rest = tok.value[n + 1 :]
                    if rest:  # the text after the bracket stays in the stream
                        self._i -= 1
                        self._toks[self._i] = Token("text", rest)
                    return ("".join(parts) + tok.value[: n + 1])[1:-1]
            parts.append(tok.value)

    def render(self, latex: str) -> str:
        """A fragment as HTML: paragraphs, lists, tables and figures."""
        saved = (self._toks, self._i)
        self._toks, self._i = tokens(latex), 0
        try:
            return _paragraphs(self._items(stop=None))
        finally:
            self._toks, self._i = saved

    def inline(self, latex: str) -> str:
        """A fragment that holds no block (a title, a caption, a table cell) as HTML."""
        saved = (self._toks, self._i)
        self._toks, self._i = tokens(latex), 0
        try:
            parts = []
            for kind, text in self._items(stop=None):
                if kind == "block":
                    raise UnknownLatex(f"a block where only text may stand: {latex[:80]!r}")
                parts.append(" " if kind == "par" else text)
            return "".join(parts).strip()
        finally:
            self._toks, self._i = saved

    # -- the parser --------------------------------------------------------------------------

    def _items(self, stop: str | None) -> Iterator[tuple[str, str]]:
        """(``inline`` | ``block`` | ``par``, html) up to ``stop`` (``close``: a group's end;
        ``end:<env>``: an environment's end; ``math``; ``item``: a list item's end; None: the
        fragment's end)."""
        while (tok := self._peek()) is not None:
            if stop == "item" and tok.kind == "cmd" and tok.value in ("\\item", "\\end"):
                return
            self._i += 1
            if tok.kind == "text":
                yield "inline", _text(tok.value)
            elif tok.kind == "par":
                yield "par", ""
            elif tok.kind == "tilde":
                yield "inline", "&nbsp;"
            elif tok.kind == "open":
                yield from self._items(stop="close")
            elif tok.kind == "close":
                if stop == "close":
                    return
                raise UnknownLatex("an unbalanced '}'")
            elif tok.kind == "math":
                yield "inline", f'<span class="math">{self._math()}</span>'
            elif tok.kind == "amp":
                raise UnknownLatex("'&' outside a table")
            else:
                end = yield from self._command(tok.value[1:], stop)
                if end:
                    return
        if stop not in (None, "item"):
            raise UnknownLatex(f"the fragment ends before its {stop}")

    def _command(self, name: str, stop: str | None) -> Generator[tuple[str, str], None, bool]:
        """One command's output; returns True where it ended the environment ``stop``."""
        if name in SYMBOLS:
            if name.isalpha():
                self._empty_group()
            yield "inline", SYMBOLS[name]
        elif name in IGNORED:
            pass
        elif name in ("\\", "newline"):
            self._optional()
            yield "inline", "<br>"
        elif name == "par":
            yield "par", ""
        elif name in TEXT_COMMANDS:
            tag = TEXT_COMMANDS[name]
            yield "inline", f"<{tag}>{self.inline(self._raw_group())}</{tag}>"
        elif name == "paragraph":
            title = self.inline(self._raw_group())
            yield "par", ""
            yield "inline", f'<strong class="run-in">{title}</strong> '
        elif name == "ref":
            label = self._raw_group()
            if label not in self.numbers.by_label:
                raise UnknownLatex(f"\\ref{{{label}}} names no label of this report")
            yield "inline", f'<a href="#{anchor_of(label)}">{self.numbers.by_label[label]}</a>'
        elif name == "label":
            self._raw_group()  # sections carry their label on the heading
        elif name == "setlength":
            self._raw_group()
            self._raw_group()
        elif name == "begin":
            env = self._raw_group()
            yield "block", self._environment(env)
        elif name == "end":
            env = self._raw_group()
            if stop == f"end:{env}":
                return True
            raise UnknownLatex(f"\\end{{{env}}} without its \\begin")
        elif name == "mathrm":
            yield "inline", self.inline(self._raw_group())
        else:
            raise UnknownLatex(f"no HTML for the LaTeX command \\{name}")
        return False

    def _empty_group(self) -> None:
        """Swallow the ``{}`` after a symbol command (``\\textbackslash{}``)."""
        tok = self._peek()
        nxt = self._toks[self._i + 1] if self._i + 1 < len(self._toks) else None
        if tok is not None and tok.kind == "open" and nxt is not None and nxt.kind == "close":
            self._i += 2

    def _math(self) -> str:
        """Inline math up to the closing ``$``: symbols, sub- and superscripts, fractions."""
        parts: list[str] = []
        while True:
            tok = self._next()
            if tok.kind == "math":
                return "".join(parts)
            if tok.kind == "text":
                parts.append(self._math_text(tok.value))
            elif tok.kind == "open":
                self._i -= 1
                parts.append(self._math_group())
            elif tok.kind == "cmd":
                name = tok.value[1:]
                if name == "frac":
                    num, den = self._math_group(), self._math_group()
                    parts.append(f"{_wrap(num)}/{_wrap(den)}")
                elif name == "mathrm":
                    parts.append(self._math_group())
                elif name in SYMBOLS:
                    parts.append(SYMBOLS[name])
                else:
                    raise UnknownLatex(f"no HTML for the math command \\{name}")
            elif tok.kind == "tilde":
                parts.append("&nbsp;")
            else:
                raise UnknownLatex(f"no HTML for {tok.value!r} in math")

    def _math_text(self, raw: str) -> str:
        """Math text: ``^x`` and ``_x`` (one character; a group or command follows as the
        next token) as super- and subscripts."""
        out = []
        chars = iter(raw)
        for ch in chars:
            if ch in "^_":
                tag = "sup" if ch == "^" else "sub"
                arg = next(chars, None)
                if arg is None:  # the script is the next token: a group or a command
                    out.append(f"<{tag}>{self._math_atom()}</{tag}>")
                else:
                    out.append(f"<{tag}>{html.escape(arg)}</{tag}>")
            else:
                out.append(html.escape(ch, quote=False))
        return "".join(out)

    def _math_atom(self) -> str:
        tok = self._peek()
        if tok is not None and tok.kind == "open":
            return self._math_group()
        tok = self._next()
        name = tok.value[1:]
        if tok.kind == "cmd" and name in SYMBOLS:
            return SYMBOLS[name]
        raise UnknownLatex(f"no HTML for the script {tok.value!r}")

    def _math_group(self) -> str:
        raw = self._raw_group()
        saved = (self._toks, self._i)
        self._toks, self._i = [*tokens(raw), Token("math", "$")], 0
        try:
            return self._math()
        finally:
            self._toks, self._i = saved

    # -- environments ------------------------------------------------------------------------

    def _environment(self, env: str) -> str:
        if env in LISTS:
            return self._list(env)
        if env in TABULARS:
            return self._tabular(env)
        if env in ("figure", "table"):
            return self._float(env)
        if env == "abstract":
            return f'<div class="abstract">{_paragraphs(self._items(stop="end:abstract"))}</div>'
        raise UnknownLatex(f"no HTML for the LaTeX environment {env}")

    def _list(self, env: str) -> str:
        tag = LISTS[env]
        entries = []
        while True:
            self._skip_space()
            tok = self._next()
            if tok.value == "\\end":
                if self._raw_group() != env:
                    raise UnknownLatex(f"\\begin{{{env}}} closed by another environment")
                break
            if tok.value != "\\item":
                raise UnknownLatex(f"text before the first \\item of {env}")
            label = self._optional()
            body = _paragraphs(self._items(stop="item"))
            if tag == "dl":
                entries.append(f"<dt>{self.inline(label)}</dt><dd>{body}</dd>")
            else:
                entries.append(f"<li>{body}</li>")
        return f"<{tag}>{''.join(entries)}</{tag}>"

    def _float(self, env: str) -> str:
        """A figure or a table environment: its caption, label and content."""
        self._optional()
        start = self._i
        depth = 1
        while depth:  # the environment's raw LaTeX, nested environments included
            tok = self._next()
            if tok.value == "\\begin":
                depth += 1
            elif tok.value == "\\end":
                depth -= 1
        inner = "".join(t.value for t in self._toks[start : self._i - 1])
        self._raw_group()  # the closing \end's name
        return self.float_html(env, inner)

    def float_html(self, env: str, inner: str) -> str:
        """A float's content (caption, label, an image or a tabular) as a captioned block."""
        label_match = re.search(r"\\label\{([^}]*)\}", inner)
        label = label_match.group(1) if label_match else ""
        caption = _caption_of(inner)
        caption_html = self._caption_html(env, caption, label) if caption else ""
        anchor = f' id="{anchor_of(label)}"' if label else ""
        if env == "figure":
            graphic = re.search(r"\\includegraphics(?:\[[^]]*\])?\{([^}]*)\}", inner)
            if graphic is None:
                raise UnknownLatex("a figure without \\includegraphics")
            img = self.image(graphic.group(1), caption)
            return f"<figure{anchor}>{img}<figcaption>{caption_html}</figcaption></figure>"
        self._pending = (caption_html, anchor)
        try:
            table = self.render(_strip_caption(inner))
        finally:
            self._pending = None
        if not table.startswith("<table"):
            raise UnknownLatex(f"a table float holds more than a tabular: {inner[:80]!r}")
        return table

    def _caption_html(self, env: str, caption: str, label: str) -> str:
        """``Table 3: ...`` (LaTeX's number of ``label``) as HTML."""
        number = self.numbers.by_label.get(label)
        name = "Figure" if env == "figure" else "Table"
        head = f"{name} {number}:" if number is not None else f"{name}:"
        return f'<span class="float-name">{head}</span> {self.inline(caption)}'

    def image(self, path: str, caption: str) -> str:
        """``figures/<name>.pdf`` as an ``<img>`` of the SVG beside it, inlined."""
        svg = self.figures_dir / Path(path).with_suffix(".svg")
        if not svg.is_file():
            raise FileNotFoundError(f"{svg}: the figure's SVG was not written")
        data = base64.b64encode(svg.read_bytes()).decode("ascii")
        alt = html.escape(re.sub(r"\\[A-Za-z]+|[{}$]", "", caption), quote=True)
        return f'<img src="data:image/svg+xml;base64,{data}" alt="{alt}">'

    def _tabular(self, env: str) -> str:
        """A booktabs tabular (or longtable) as an HTML table, header rows in ``thead``."""
        if env in ("tabularx",):
            self._raw_group()  # its width
        self._raw_group()  # the column spec
        rows: list[list[tuple[int, str]]] = []
        header_rows = 0
        caption_html, anchor = self._pending or ("", "")
        self._pending = None  # a tabular nested in this one is not the float's
        own_caption = own_label = ""
        skipping = False  # a longtable's repeated header and foot
        cells: list[tuple[int, str]] = []
        current: list[str] = []
        colspan = 1

        def close_cell() -> None:
            nonlocal current, colspan
            cells.append((colspan, "".join(current).strip()))
            current, colspan = [], 1

        while True:
            tok = self._next()
            if tok.kind == "cmd" and tok.value == "\\end":
                if self._raw_group() != env:
                    raise UnknownLatex(f"\\begin{{{env}}} closed by another environment")
                break
            if tok.kind == "cmd":
                name = tok.value[1:]
                if name in ("endfirsthead", "endlastfoot"):
                    skipping = name == "endfirsthead"
                    continue
                if name == "endhead":
                    continue
                if skipping:
                    continue
                if name == "\\":
                    close_cell()
                    if any(text for _, text in cells):
                        rows.append(cells)
                    cells = []
                    continue
                if name == "midrule":
                    header_rows = header_rows or len(rows)
                    continue
                if name in ("toprule", "bottomrule"):
                    continue
                if name == "cmidrule":
                    self._optional_paren()
                    self._raw_group()
                    continue
                if name == "multicolumn":
                    colspan = int(self._raw_group())
                    self._raw_group()  # its alignment
                    current.append(self.inline(self._raw_group()))
                    continue
                if name == "caption":  # a longtable's caption is inside it
                    own_caption = self._raw_group()
                    continue
                if name == "label":
                    own_label = self._raw_group()
                    continue
                self._i -= 1
                current.append(self._inline_tokens_one())
                continue
            if skipping:
                continue
            if tok.kind == "amp":
                close_cell()
            elif tok.kind == "par":
                continue
            else:
                self._i -= 1
                current.append(self._inline_tokens_one())
        close_cell()
        if any(text for _, text in cells):
            rows.append(cells)
        if own_caption:
            caption_html = self._caption_html("table", own_caption, own_label)
            anchor = f' id="{anchor_of(own_label)}"' if own_label else ""
        head, body = rows[:header_rows], rows[header_rows:]
        numeric = _numeric_columns(body)
        parts = [f'<table class="booktabs"{anchor}>']
        if caption_html:
            parts.append(f"<caption>{caption_html}</caption>")
        if head:
            parts.append("<thead>")
            for i, row in enumerate(head):
                last = i == len(head) - 1  # the column names: sortable
                parts.append(_row(row, "th", numeric if last else None, sortable=last))
            parts.append("</thead>")
        parts.append("<tbody>")
        parts += [_row(row, "td", numeric) for row in body]
        parts.append("</tbody></table>")
        return "".join(parts)

    def _optional_paren(self) -> None:
        """``(lr)`` after ``\\cmidrule``."""
        tok = self._peek()
        if tok is not None and tok.kind == "text" and tok.value.startswith("("):
            close = tok.value.index(")")
            rest = tok.value[close + 1 :]
            if rest:
                self._toks[self._i] = Token("text", rest)
            else:
                self._i += 1

    def _inline_tokens_one(self) -> str:
        """One token (or command with its arguments) of a table cell, as HTML."""
        tok = self._next()
        if tok.kind == "text":
            return _text(tok.value)
        if tok.kind == "tilde":
            return "&nbsp;"
        if tok.kind == "math":
            return f'<span class="math">{self._math()}</span>'
        if tok.kind == "open":
            return "".join(text for _, text in self._items(stop="close"))
        if tok.kind == "cmd":
            out = []
            for kind, text in self._command(tok.value[1:], stop=None):
                if kind == "block":
                    raise UnknownLatex("a block inside a table cell")
                out.append(text)
            return "".join(out)
        raise UnknownLatex(f"no HTML for {tok.value!r} in a table")


def anchor_of(label: str) -> str:
    """An HTML id for a LaTeX label (``tab:x`` -> ``tab-x``)."""
    return label.replace(":", "-")


def _wrap(text: str) -> str:
    """A fraction's part, parenthesised where it is more than one symbol."""
    plain = re.sub(r"<[^>]+>", "", text)
    return text if re.fullmatch(r"[\w.&;]+", plain) else f"({text})"


def _caption_of(inner: str) -> str:
    """The raw LaTeX of the ``\\caption{...}`` argument in ``inner`` (braces balanced)."""
    start = inner.find("\\caption{")
    if start < 0:
        return ""
    depth, i = 0, start + len("\\caption")
    for j in range(i, len(inner)):
        depth += {"{": 1, "}": -1}.get(inner[j], 0) if inner[j - 1] != "\\" else 0
        if depth == 0:
            return inner[i + 1 : j]
    raise UnknownLatex("an unclosed \\caption")


def _strip_caption(inner: str) -> str:
    """``inner`` without its ``\\caption{...}`` and ``\\label{...}`` (a table's own content)."""
    caption = _caption_of(inner)
    if caption:
        inner = inner.replace(f"\\caption{{{caption}}}", "", 1)
    return re.sub(r"\\label\{[^}]*\}", "", inner)


_NUMBER = re.compile(r"^\s*-?[\d,]*\.?\d+")


def _number(text: str) -> float | None:
    match = _NUMBER.match(re.sub(r"<[^>]+>", "", text).replace("&nbsp;", " "))
    return float(match.group().replace(",", "")) if match else None


def _numeric_columns(rows: Sequence[Sequence[tuple[int, str]]]) -> list[bool]:
    """Per column: every filled cell starts with a number (right-aligned, sorted as numbers)."""
    width = max((sum(span for span, _ in row) for row in rows), default=0)
    numeric = [True] * width
    for row in rows:
        col = 0
        for span, text in row:
            if span == 1 and text not in ("", "&ndash;") and _number(text) is None:
                numeric[col] = False
            col += span
    return numeric


def _row(
    cells: Sequence[tuple[int, str]],
    tag: str,
    numeric: list[bool] | None,
    *,
    sortable: bool = False,
) -> str:
    parts, col = [], 0
    for span, text in cells:
        attrs = f' colspan="{span}"' if span > 1 else ""
        classes = []
        if numeric is not None and span == 1 and col < len(numeric) and numeric[col]:
            classes.append("num")
        if sortable and span == 1:
            classes.append("sortable")
        if classes:
            attrs += f' class="{" ".join(classes)}"'
        if sortable and span == 1:
            attrs += ' title="sort by this column"'
        parts.append(f"<{tag}{attrs}>{text}</{tag}>")
        col += span
    return f"<tr>{''.join(parts)}</tr>"


def _paragraphs(items: Iterator[tuple[str, str]]) -> str:
    """Inline runs as ``<p>`` paragraphs, broken at paragraph breaks and around blocks."""
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        text = "".join(run).strip()
        if text:
            out.append(f"<p>{text}</p>")
        run.clear()

    for kind, text in items:
        if kind == "inline":
            run.append(text)
        elif kind == "par":
            flush()
        else:
            flush()
            out.append(text)
    flush()
    return "\n".join(out)
