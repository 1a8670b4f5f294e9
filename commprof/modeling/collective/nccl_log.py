"""nccl-tests / rccl-tests output as clusters print it: a reader strict about what is wrong.

The reader takes the text users already have. Every line may carry a launcher's prefix, stripped
before anything else: Slurm ``srun -l`` task labels (``0: ``, `` 12: ``), Open MPI's
``[1,0]<stdout>:``, ``kubectl logs --prefix`` (``[pod/launcher-x/mpi] ``) and ``--timestamps``,
and the indentation of a page it was copied from. The table's own header line names its columns
(with or without ``redop`` or ``root``, ``#wrong`` or ``error``, one or two halves), so a row is
read by name, never guessed from its shape: older nccl-tests print times of 10,000 us and more as
integers. One file may hold several runs, each from its header (``# nThread``, ``#  Rank`` lines)
to its ``# Avg bus bandwidth`` footer; a run without the footer (cut short, or an excerpt) is read
and marked incomplete.

What is skipped is counted, never dropped silently (:attr:`Run.skipped`): rows of 0 bytes (the
all_gather, reduce_scatter and alltoall sizes below ranks x type size), a row that an interleaved
NCCL/RCCL log line broke, and rows with a non-zero ``#wrong`` (or an ``error`` marked ``*``):
those measured corrupted data, so no fit may use them. Anything else that does not read (a cut
line, a field that is not a number, a row before any header) is refused with the file and line.

A run whose header does not name its test (``# Collective test starting: X_perf``, or its
``concluded`` line) is named by its table where the table allows only one collective: busbw /
algbw at the run's world size, and the ``root`` and ``redop`` columns (:func:`table_collectives`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from commprof.yamlio import read_text

MAX_LOG_BYTES = 64 << 20
"""Largest log read (64 MiB: a run with NCCL_DEBUG=INFO on thousands of ranks is a few MiB);
a larger file is refused before it is read."""
_PREFIXES = (
    re.compile(r"^\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),  # kubectl
    re.compile(r"^\s*\[pod/[^\]\s]+\]\s?"),  # kubectl logs --prefix
    re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?"),  # Open MPI --tag-output
    re.compile(r"^\s*\d+:\s"),  # srun -l / --label
)
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_COLLECTIVE = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_CONCLUDED = re.compile(r"Collective test concluded:\s*(\w+?)_perf")
_PREAMBLE = re.compile(r"^#\s*(?:nThread\s|Collective test starting|Using devices)")
_FOOTER = re.compile(r"^#\s*Avg bus bandwidth\s*:")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_DEBUG = re.compile(r"\b(?:NCCL|RCCL)\s+(?:INFO|WARN|TRACE|VERSION)\b|\bUCX\s+(?:WARN|ERROR)\b")
"""A library's log line (``NCCL_DEBUG=INFO``, UCX warnings): text interleaved with the table."""
_WRONG_COLUMNS = ("#wrong", "error")
_SIGNATURES = (
    # nccl-tests' src/*.cu: busbw / algbw (2: 2(n-1)/n, 1: (n-1)/n, 0: 1), a root >= 0 printed,
    # a reduction printed as redop (all_gather, broadcast, alltoall, gather, scatter print
    # 'none' or, in older layouts, no redop column; older layouts print root only where rooted)
    ("all_reduce", 2, False, True),
    ("reduce_scatter", 1, False, True),
    ("all_gather", 1, False, False),
    ("alltoall", 1, False, False),
    ("broadcast", 0, True, False),
    ("reduce", 0, True, True),
    ("sendrecv", 0, False, True),
    ("gather", 1, True, False),
    ("scatter", 1, True, False),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One message size of a run."""

    num_bytes: int
    """``size`` column (bytes)."""
    dtype: str
    """``type`` column (``float``, ``bfloat16``, ``int8`` ...)."""
    redop: str | None
    """``redop`` column (``sum``, ``none`` ...); None where the layout has none (broadcast)."""
    time_us: float
    """Out-of-place time (us)."""
    algbw_gbps: float
    """Out-of-place algbw (GB/s)."""
    busbw_gbps: float
    """Out-of-place busbw (GB/s)."""
    inplace_time_us: float | None
    """In-place time (us); None where the log has no in-place half."""
    line: int
    """Line number in the file (1-based)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Skipped:
    """A line of a table that no row came from, and why."""

    line: int
    """Line number in the file (1-based)."""
    kind: str
    """``0 bytes``, ``#wrong`` (wrong results: not a measurement to fit) or ``broken`` (a log
    line interleaved with the row)."""
    text: str
    """The line as read (prefixes stripped)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    """One run of a test: a header, its table and (if it finished) its footer."""

    index: int
    """1-based position of the run in its file (``--run K``)."""
    header_line: int
    """Line of the table's column header."""
    collective: str | None
    """From ``Collective test starting: X_perf`` (or ``concluded``) where printed, else the one
    collective of ``candidates``, else None."""
    world_size: int | None
    """Ranks (``#  Rank`` lines of this run); None where the log lists none."""
    num_hosts: int | None
    """Distinct hosts of those ranks; None where the log lists none or some were cut (``...``)."""
    rows: tuple[Row, ...]
    """The rows kept, in file order."""
    skipped: tuple[Skipped, ...]
    """Table lines read but not kept (0-byte rows, rows broken or with wrong results)."""
    complete: bool
    """The ``# Avg bus bandwidth`` footer was printed; False for a run cut short or an excerpt."""
    candidates: tuple[str, ...] = ()
    """The collectives the table itself fits (:func:`table_collectives`); () where it shows too
    little to tell."""
    evidence: str = ""
    """What the table shows, said aloud (``busbw/algbw 1.750 at 8 ranks, redop sum, root -1``)."""
    inferred: bool = False
    """``collective`` was inferred from the table: the header does not name it."""

    def describe(self) -> str:
        """One line: ``run 2 (line 40): all_reduce, 16 ranks, 8 B..8589934592 B, 31 rows``."""
        sizes = f"{self.rows[0].num_bytes} B..{self.rows[-1].num_bytes} B" if self.rows else "-"
        ranks = "ranks not listed" if self.world_size is None else f"{self.world_size} ranks"
        name = self.collective or "collective not named"
        if self.inferred:
            name += " (inferred from the table)"
        elif self.collective is None and self.candidates:
            name += f" (the table fits {' or '.join(self.candidates)})"
        footer = "" if self.complete else ", no footer"
        return f"run {self.index} (line {self.header_line}): {name}, {ranks}, {sizes}, " + (
            f"{len(self.rows)} rows{footer}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class NcclTestsLog:
    """One file of nccl-tests output: one run or several."""

    source: str
    """The file."""
    runs: tuple[Run, ...]
    """Its runs, in file order (at least one)."""

    @property
    def run(self) -> Run:
        """The only run; a file of several must be narrowed first (:meth:`select`)."""
        if len(self.runs) != 1:
            listed = "; ".join(r.describe() for r in self.runs)
            raise ValueError(
                f"{self.source}: holds {len(self.runs)} runs ({listed}); pick one with --run K "
                "or use each with --run all"
            )
        return self.runs[0]

    @property
    def rows(self) -> tuple[Row, ...]:
        """The rows of the only run."""
        return self.run.rows

    @property
    def world_size(self) -> int | None:
        """The ranks of the only run."""
        return self.run.world_size

    @property
    def num_hosts(self) -> int | None:
        """The hosts of the only run."""
        return self.run.num_hosts

    @property
    def collective(self) -> str | None:
        """The collective of the only run."""
        return self.run.collective

    def select(self, index: int) -> NcclTestsLog:
        """This file narrowed to its run ``index`` (1-based)."""
        if not 1 <= index <= len(self.runs):
            listed = "; ".join(r.describe() for r in self.runs)
            raise ValueError(
                f"{self.source}: --run {index}: the file holds {len(self.runs)} run(s) ({listed})"
            )
        return replace(self, runs=(self.runs[index - 1],))

    def split(self) -> list[NcclTestsLog]:
        """One log per run."""
        return [replace(self, runs=(r,)) for r in self.runs]


def _strip(line: str) -> str:
    for _ in range(len(_PREFIXES)):
        before = line
        for prefix in _PREFIXES:
            line = prefix.sub("", line, count=1)
        if line == before:
            break
    return line


class _Builder:
    """The run being read: its preamble (ranks, collective), then its table."""

    def __init__(self) -> None:
        self.ranks: dict[int, str] = {}
        self.collective: str | None = None
        self.columns: list[str] | None = None
        self.header_line = 0
        self.rows: list[Row] = []
        self.skipped: list[Skipped] = []
        self.keys: set[tuple[int, str, str | None]] = set()
        self.footer = False
        self.broken_at = 0
        """Line of the last row a log line broke (its remainder may follow)."""
        self.elided = False
        """A ``...`` line among the rank lines: the page that printed the log cut some."""
        self.roots: set[str] = set()
        """The ``root`` column's values (of the rows kept)."""

    def finish(self, source: str, index: int) -> Run:
        ranks = self.ranks
        world_size, num_hosts = len(ranks) or None, len(set(ranks.values())) or None
        if ranks and self.elided and 0 in ranks:
            # "#  Rank 0 ..., ..., #  Rank 127 ...": the last rank listed is the world's last
            world_size, num_hosts = max(ranks) + 1, None
        elif ranks and sorted(ranks) != list(range(len(ranks))):
            raise ValueError(
                f"{source}:{self.header_line}: the rank lines of this run are not "
                f"0..{len(ranks) - 1} (ranks {min(ranks)}..{max(ranks)}, {len(ranks)} lines); "
                "keep every '#  Rank' line of the header"
            )
        if not self.rows and not self.skipped:
            raise ValueError(f"{source}:{self.header_line}: the table has a header but no rows")
        run = Run(
            index=index,
            header_line=self.header_line,
            collective=self.collective,
            world_size=world_size,
            num_hosts=num_hosts,
            rows=tuple(self.rows),
            skipped=tuple(self.skipped),
            complete=self.footer,
        )
        assert self.columns is not None
        candidates, evidence = table_collectives(run, self.columns, self.roots)
        inferred = self.collective is None and len(candidates) == 1
        return replace(
            run,
            collective=candidates[0] if inferred else self.collective,
            candidates=candidates,
            evidence=evidence,
            inferred=inferred,
        )


def parse_text(text: str, source: str) -> NcclTestsLog:
    """Read nccl-tests / rccl-tests output: one run or several.

    Args:
        text: The log's text.
        source: Its name in error messages (a path).

    Returns:
        The parsed log.

    Raises:
        ValueError: naming ``source`` and the line when the text holds no table or a line of a
            table does not read.
    """
    if len(text) > MAX_LOG_BYTES:
        raise ValueError(f"{source}: {len(text):,} characters, more than {MAX_LOG_BYTES:,}")
    runs: list[Run] = []
    run = _Builder()
    lines = text.splitlines()
    for number, raw in enumerate(lines, start=1):
        stripped = _strip(raw).strip()
        if not stripped:
            continue
        if (m := _COLLECTIVE.search(stripped)) is not None or _PREAMBLE.match(stripped):
            if run.columns is not None:  # a new run's header after the last one's table
                runs.append(run.finish(source, len(runs) + 1))
                run = _Builder()
            if m is not None:
                run.collective = m.group(1)
            continue
        if (m := _RANK.match(stripped)) is not None:
            if run.columns is not None:
                runs.append(run.finish(source, len(runs) + 1))
                run = _Builder()
            run.ranks[int(m.group(1))] = m.group(2)
            continue
        if stripped.startswith("#"):
            words = stripped.lstrip("#").split()
            if words[:2] == ["size", "count"] and ("time" in words or "cputime" in words):
                if run.columns is not None:
                    runs.append(run.finish(source, len(runs) + 1))
                    run = _Builder()
                run.columns, run.header_line = words, number
            elif _FOOTER.match(stripped) and run.columns is not None:
                run.footer = True
            elif (m := _CONCLUDED.search(stripped)) and run.columns and run.collective is None:
                run.collective = m.group(1)  # an excerpt from the table down names its test
            continue
        if not stripped[0].isdigit():
            if set(stripped) == {"."} and len(stripped) >= 3 and run.ranks and run.columns is None:
                run.elided = True
            continue  # NCCL INFO lines, launcher messages, versions
        in_table = run.columns is not None and not run.footer
        if _DEBUG.search(stripped) and not (in_table and _opens_row(stripped.split())):
            continue  # a log line of a host whose name starts with a digit
        if run.columns is None:
            raise ValueError(
                f"{source}:{number}: a table row before any header line "
                "('#  size  count  type ... time  algbw  busbw ...'); is the log cut at the top?"
            )
        if run.footer:
            raise ValueError(
                f"{source}:{number}: a row after the '# Avg bus bandwidth' footer of the run "
                f"whose table starts at line {run.header_line}, and no header of its own"
            )
        _add_row(run, stripped, _next_line(lines, number), source, number)
    if run.columns is not None:
        runs.append(run.finish(source, len(runs) + 1))
    if not runs:
        raise ValueError(
            f"{source}: no nccl-tests table found (no header line '#  size  count  type ... time "
            "algbw  busbw'); give the output of all_reduce_perf or a sibling test"
        )
    return NcclTestsLog(source=source, runs=tuple(runs))


def _add_row(run: _Builder, stripped: str, next_line: str, source: str, number: int) -> None:
    columns = run.columns
    assert columns is not None
    fields = stripped.split()
    if columns[-1] == "timestamp" and len(fields) == len(columns) + 1:
        fields[-2:] = [" ".join(fields[-2:])]  # nccl-tests -T: "2025-11-02 20:32:20"
    if _DEBUG.search(stripped) or len(fields) != len(columns):
        # A row that an interleaved log line broke: its head and the log line share a line (or
        # the log line follows a cut head), and its remainder, which does not open a row, comes
        # after the log line. Each part is counted; any other cut line is refused.
        head = _opens_row(fields) and (
            _DEBUG.search(stripped) is not None
            or (len(fields) < len(columns) and _DEBUG.search(next_line) is not None)
        )
        if head or (run.broken_at and not _opens_row(fields)):
            run.broken_at = number if head else run.broken_at
            run.skipped.append(Skipped(line=number, kind="broken", text=stripped))
            return
        raise ValueError(
            f"{source}:{number}: {len(fields)} fields where the header (line "
            f"{run.header_line}, columns {columns}) has {len(columns)}; is the line cut?"
        )
    row_fields = dict(zip(_names(columns), fields, strict=True))

    def number_at(name: str) -> float:
        text = row_fields[name]
        if not _NUMBER.match(text):
            raise ValueError(f"{source}:{number}: {name.split('.')[0]} {text!r} is not a number")
        return float(text)

    size = number_at("size")
    if size < 0 or size != int(size):
        raise ValueError(f"{source}:{number}: size {row_fields['size']!r} is not a whole number")
    run.broken_at = 0
    if size == 0:
        run.skipped.append(Skipped(line=number, kind="0 bytes", text=stripped))
        return
    if _wrong(row_fields, source, number):
        run.skipped.append(Skipped(line=number, kind="#wrong", text=stripped))
        return
    time_us = number_at("time")
    if not time_us > 0:
        raise ValueError(f"{source}:{number}: time {row_fields['time']!r} must be > 0 us")
    inplace = row_fields.get("time.2")
    key = (int(size), row_fields["type"], row_fields.get("redop"))
    if key in run.keys:
        raise ValueError(
            f"{source}:{number}: size {int(size)} ({key[1]}, {key[2]}) appears twice in the "
            f"table of line {run.header_line}; give each run its own header"
        )
    run.keys.add(key)
    if "root" in row_fields:
        run.roots.add(row_fields["root"])
    run.rows.append(
        Row(
            num_bytes=int(size),
            dtype=row_fields["type"],
            redop=row_fields.get("redop"),
            time_us=time_us,
            algbw_gbps=number_at("algbw"),
            busbw_gbps=number_at("busbw"),
            inplace_time_us=float(inplace) if inplace and _NUMBER.match(inplace) else None,
            line=number,
        )
    )


def _names(columns: Sequence[str]) -> list[str]:
    """Column names made unique: the in-place half's ``time`` is ``time.2``; ``cputime`` (nccl-tests
    ``-C``: the host's time of a call, not the GPU's) is read as ``time``."""
    seen: dict[str, int] = {}
    out = []
    for c in ("time" if c == "cputime" else c for c in columns):
        seen[c] = seen.get(c, 0) + 1
        out.append(c if seen[c] == 1 else f"{c}.{seen[c]}")
    return out


def _wrong(row_fields: dict[str, str], source: str, number: int) -> str | None:
    """The wrong-result count or flagged error of a row (either half), or None where clean."""
    for name, text in row_fields.items():
        if name.split(".")[0] not in _WRONG_COLUMNS or text == "N/A":
            continue
        if name.startswith("error"):
            if text.endswith("*"):
                return text
            continue
        if not _NUMBER.match(text):  # large counts print as 3.55843e+07
            raise ValueError(f"{source}:{number}: #wrong {text!r} is not a count or N/A")
        if float(text):
            return text
    return None


def _opens_row(fields: Sequence[str]) -> bool:
    """A line opens a row: a size, then a count, then a type (or what is left of them)."""
    return (
        len(fields) >= 2
        and fields[0].isdigit()
        and fields[1].isdigit()
        and (len(fields) == 2 or fields[2][:1].isalpha())
    )


def _next_line(lines: Sequence[str], number: int) -> str:
    """The next non-empty line after line ``number`` (1-based), prefixes stripped."""
    for raw in lines[number : number + 4]:
        if stripped := _strip(raw).strip():
            return stripped
    return ""


def read_log(path: str | Path) -> NcclTestsLog:
    """Read one log file (see :func:`parse_text`); a file over ``MAX_LOG_BYTES`` is refused
    unread."""
    return parse_text(read_text(path, "the nccl-tests log", max_bytes=MAX_LOG_BYTES), str(path))


def read_logs(paths: Sequence[str | Path], run: str | None = None) -> list[NcclTestsLog]:
    """Read every log of a command line, each narrowed to one run.

    Args:
        paths: The files, in the order given (a repeated path is refused: it would count twice).
        run: ``None`` (each file must hold one run), ``"all"`` (each run of each file is a log of
            its own) or ``"K"`` (run K of every file).

    Raises:
        ValueError: naming the file: a repeated path, a file of several runs and no ``run``, or
            a ``run`` the file does not hold.
    """
    seen: set[str] = set()
    out: list[NcclTestsLog] = []
    for path in paths:
        if str(path) in seen:
            raise ValueError(f"{path}: given twice; give each log once")
        seen.add(str(path))
        log = read_log(path)
        if run == "all":
            out.extend(log.split())
        elif run is not None:
            if not run.isdigit():
                raise ValueError(f"--run {run!r}: give a run number (1, 2 ...) or 'all'")
            out.append(log.select(int(run)))
        else:
            log.run  # noqa: B018 -- raises, listing the runs, where the file holds several
            out.append(log)
    return out


def implied_world_size(run: Run) -> int | None:
    """The ranks that the run's busbw / algbw ratio implies, a check on logs without rank lines.

    nccl-tests prints busbw = algbw x 2(n-1)/n for all-reduce and x (n-1)/n for all-gather,
    reduce-scatter and alltoall (NVIDIA/nccl-tests doc/PERFORMANCE.md), so a ratio r > 1 gives
    n = 2 / (2 - r) and r < 1 gives n = 1 / (1 - r). Both bandwidths are printed to 0.01 GB/s, so
    each row bounds n to an interval; the answer is the one whole number in every row's interval.

    Returns:
        The world size, or None where the rows do not pin one (a ratio of 1: broadcast or two
        ranks of an all-gather; rows too slow for the rounding; many ranks, whose ratios differ
        by less than it).
    """
    rows = [r for r in run.rows if r.algbw_gbps >= 1.0]
    if not rows:
        return None
    ratio = sorted(r.busbw_gbps / r.algbw_gbps for r in rows)[len(rows) // 2]
    if abs(ratio - 1.0) < 0.01 or not 0.0 < ratio < 2.0:
        return None
    factor = 2.0 if ratio > 1.0 else 1.0
    low, high = 1.0, float("inf")
    for r in rows:
        r_low = (r.busbw_gbps - 0.005) / (r.algbw_gbps + 0.005)
        r_high = (r.busbw_gbps + 0.005) / (r.algbw_gbps - 0.005)
        low = max(low, factor / (factor - r_low)) if r_low < factor else low
        high = min(high, factor / (factor - r_high)) if r_high < factor else high
    whole = [n for n in range(math.ceil(low), math.floor(high) + 1)] if high < 1e6 else []
    return whole[0] if len(whole) == 1 else None


def table_collectives(
    run: Run, columns: Sequence[str], roots: set[str]
) -> tuple[tuple[str, ...], str]:
    """The collectives a run's table fits, whatever its header says, and what it shows.

    nccl-tests prints busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather,
    reduce_scatter and alltoall, x 1 for broadcast, reduce and sendrecv; a root >= 0 for
    broadcast and reduce (-1, or no root column in older layouts, for the rest); a reduction for
    all_reduce, reduce_scatter, reduce (and ``sum`` for sendrecv), where the others print
    ``none`` (or, in older layouts, no redop column). n is the run's rank lines, else
    :func:`implied_world_size`, else any whole number. Each row's ratio is bounded by the
    0.01 GB/s its bandwidths are printed to; every row must fit.

    Args:
        run: The run (its rows and world size).
        columns: Its table's header words.
        roots: The values its ``root`` column printed.

    Returns:
        The collectives fitted (() where the table shows too little: no row of 0.01 GB/s or
        more), and the evidence said aloud (``busbw/algbw 1.750 at 8 ranks, redop sum, root
        -1``).
    """
    lo, hi, ratios = 0.0, math.inf, []
    for r in run.rows:
        if r.algbw_gbps >= 0.01:
            ratios.append(r.busbw_gbps / r.algbw_gbps)
            lo = max(lo, (r.busbw_gbps - 0.005) / (r.algbw_gbps + 0.005))
            hi = min(hi, (r.busbw_gbps + 0.005) / (r.algbw_gbps - 0.005))
    redops = {r.redop for r in run.rows}
    said_redop = f"redop {'/'.join(sorted(map(str, redops)))}" if "redop" in columns else ""
    reductions = {op not in (None, "none") for op in redops}
    reduces = reductions.pop() if len(reductions) == 1 else None
    said_root = f"root {'/'.join(sorted(roots))}" if "root" in columns else "no root column"
    signs = {x.startswith("-") for x in roots} if "root" in columns else {True}
    rooted = not signs.pop() if len(signs) == 1 else None
    said_redop = said_redop or "no redop column"
    if not ratios:
        return (), f"busbw/algbw not shown (no row of 0.01 GB/s), {said_redop}, {said_root}"
    ratio = sorted(ratios)[len(ratios) // 2]
    if lo > hi:  # printed figures that do not agree to their rounding: the median's 1 %
        lo, hi = ratio * 0.99, ratio * 1.01
    lo, hi = lo * (1 - 1e-3), hi * (1 + 1e-3)
    n = run.world_size or implied_world_size(run)
    said = f"busbw/algbw {ratio:.3f} " + ("(ranks not known)" if n is None else f"at {n} ranks")
    if run.world_size is None and n is not None:
        said += " (implied)"

    def fits(kind: int) -> bool:
        if kind == 0:
            return lo <= 1.0 <= hi
        if n is not None:
            return lo <= kind * (n - 1) / n <= hi
        if lo >= kind or hi >= kind:  # kind x (n-1)/n is below kind and comes near it
            return lo < kind
        return math.floor(1 / (1 - hi / kind)) >= math.ceil(1 / (1 - max(lo, 0.0) / kind))

    names = tuple(
        name
        for name, kind, has_root, reduction in _SIGNATURES
        if fits(kind) and rooted in (None, has_root) and reduces in (None, reduction)
    )
    return names, f"{said}, {said_redop}, {said_root}"


def check_collective(log: NcclTestsLog, collective: str, choices: Sequence[str] = ()) -> None:
    """Refuse a log of another collective than ``collective``: the one its header names, or
    where it names none, one its table does not fit (:attr:`Run.candidates`).

    Args:
        log: The log (each of its runs is checked).
        collective: The collective asked for.
        choices: The collectives the caller could take instead (``--collective Y``); () where
            it takes ``collective`` only.

    Raises:
        ValueError: naming the file, what its header or table shows, and what to change.
    """
    for r in log.runs:
        named = r.collective is not None and not r.inferred
        if collective == r.collective or (
            not named and (not r.candidates or collective in r.candidates)
        ):
            continue
        fits = (r.collective,) if r.collective is not None else r.candidates
        what = f"is a {r.collective} log" if r.collective else f"fits {' or '.join(fits)}"
        how = (
            "its header names it"
            if named
            else f"its header names no collective; its table: {r.evidence}"
        )
        others = [c for c in fits if c in choices]
        fix = f"give a log of {collective}"
        if others:
            fix = f"give --collective {others[0]}" + (
                "" if len(fits) == 1 else f" if it is a log of {others[0]}, else {fix[5:]}"
            )
        raise ValueError(f"{log.source}: {what}, not {collective} ({how}); {fix}")


def log_world_size(log: NcclTestsLog, given: int | None = None) -> int:
    """The log's world size: its rank lines, or ``given`` where it lists none."""
    if log.world_size is None:
        if given is None:
            raise ValueError(
                f"{log.source}: lists no '#  Rank' lines, so its world size is unknown; keep the "
                "header of the log"
            )
        return given
    if given is not None and given != log.world_size:
        raise ValueError(f"{log.source}: has {log.world_size} ranks, not {given}")
    return log.world_size


def skipped_summary(log: NcclTestsLog) -> str | None:
    """What a log's runs did not keep, and a collective inferred from the table rather than
    named, said aloud (``None`` where neither): ``file: run 1 skipped 3 rows (0 bytes: lines
    10-12); ...``."""
    parts = []
    for r in log.runs:
        said = f"{r.collective} inferred from the table ({r.evidence})" if r.inferred else ""
        if not r.skipped and r.complete:
            parts.extend([f"run {r.index}: {said}"] if said else [])
            continue
        by_reason: dict[str, list[int]] = {}
        for s in r.skipped:
            by_reason.setdefault(s.kind, []).append(s.line)
        rows = ", ".join(
            f"{len(lines)} {reason} (line{'s' if len(lines) > 1 else ''} "
            f"{', '.join(map(str, lines[:5]))}{' ...' if len(lines) > 5 else ''})"
            for reason, lines in by_reason.items()
        )
        parts.append(
            f"run {r.index} skipped {rows or 'nothing'}"
            + ("" if r.complete else "; no footer")
            + (f"; {said}" if said else "")
        )
    return f"{log.source}: " + "; ".join(parts) if parts else None
