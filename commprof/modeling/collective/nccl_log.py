"""nccl-tests / rccl-tests output as clusters print it: a reader strict about what is wrong.

The reader takes the text users already have. Every line may carry a launcher's prefix, stripped
before anything else: Slurm ``srun -l`` task labels (``0: ``, `` 12: ``), Open MPI's
``[1,0]<stdout>:``, ``kubectl logs --prefix`` (``[pod/launcher-x/mpi] ``) and ``--timestamps``,
Ray's and SkyPilot's process labels (``(head, rank=0, pid=3808) ``), and the indentation of a
page it was copied from, or its lost ``#`` (a page that rendered the log as Markdown). The
table's own header line names its columns (with or without ``redop`` or ``root``, ``#wrong`` or
``error``, one or two halves), so a row is read by name, never guessed from its shape: older
nccl-tests print times of 10,000 us and more as integers. Launcher lines outside a table (a
hostfile's IP addresses) are passed over. One file may hold several runs, each from its header
(``# nThread``, ``#  Rank`` lines) to its ``# Avg bus bandwidth`` footer; a run without the
footer (cut short, or an excerpt) is read and marked incomplete.

What is skipped is counted, never dropped silently (:attr:`Run.skipped`): rows of 0 bytes (the
all_gather, reduce_scatter and alltoall sizes below ranks x type size), a row that an interleaved
NCCL/RCCL log line broke, and rows with a non-zero ``#wrong`` (or an ``error`` marked ``*``):
those measured corrupted data, so no fit may use them. Anything else that does not read (a cut
line, a field that is not a number, a row before any header) is refused with the file and line.

A run whose header does not name its test (``# Collective test starting: X_perf``, or its
``concluded`` line) is named by its table where the table allows only one collective: busbw /
algbw at the run's world size, and the ``root`` and ``redop`` columns
(:func:`~commprof.modeling.collective.nccl_log_collective.table_collectives`). The records read
(rows, runs, the file) are :mod:`commprof.modeling.collective.nccl_log_runs`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from commprof.modeling.collective.nccl_log_collective import named_by_table, runs_as
from commprof.modeling.collective.nccl_log_json import looks_like_json, parse_json
from commprof.modeling.collective.nccl_log_runs import NcclTestsLog, Row, Run, Skipped
from commprof.yamlio import read_text

MAX_LOG_BYTES = 64 << 20
"""Largest log read (64 MiB: a run with NCCL_DEBUG=INFO on thousands of ranks is a few MiB);
a larger file is refused before it is read."""
_PREFIXES = (
    re.compile(r"^\s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),  # kubectl
    re.compile(r"^\s*\[pod/[^\]\s]+\]\s?"),  # kubectl logs --prefix
    re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?"),  # Open MPI --tag-output
    re.compile(r"^\s*\d+:\s"),  # srun -l / --label
    re.compile(r"^\s*\([^()]*\bpid=\d+[^()]*\)\s?"),  # Ray, SkyPilot: (head, rank=0, pid=38)
)
_RANK = re.compile(r"^(?:#\s*)?Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_COLLECTIVE = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_CONCLUDED = re.compile(r"Collective test concluded:\s*(\w+?)_perf")
_PREAMBLE = re.compile(r"^#?\s*(?:nThread\s|Collective test starting|Using devices)")
_FOOTER = re.compile(r"^#?\s*Avg bus bandwidth\s*:")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
_DEBUG = re.compile(r"\b(?:NCCL|RCCL)\s+(?:INFO|WARN|TRACE|VERSION)\b|\bUCX\s+(?:WARN|ERROR)\b")
"""A library's log line (``NCCL_DEBUG=INFO``, UCX warnings): text interleaved with the table."""
_WRONG_COLUMNS = ("#wrong", "error")


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
            raise ValueError(
                f"{source}:{self.header_line}: the table has a header but no rows (the run "
                "stopped before its first size?); give a log that reached its table"
            )
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
        return named_by_table(run, self.columns, self.roots)


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
    if looks_like_json(text):
        return parse_json(text, source)
    runs: list[Run] = []
    run = _Builder()
    orphan_footer = 0  # line of a footer with no table above it (a page cut the table)
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
            rank, host = int(m.group(1)), m.group(2)
            if rank in run.ranks:
                raise ValueError(
                    f"{source}:{number}: rank {rank} is listed twice ({run.ranks[rank]}, {host}) "
                    "in one run's header: each process ran a job of its own, as nccl-tests built "
                    "without MPI=1 does under mpirun; rebuild it with MPI=1 and run it again"
                )
            run.ranks[rank] = host
            continue
        if stripped.startswith("#") or not stripped[0].isdigit():
            # the header's '#' is optional: a page that rendered the log as Markdown dropped it
            words = stripped.lstrip("#").split()
            if words[:2] == ["size", "count"] and ("time" in words or "cputime" in words):
                if missing := [c for c in ("type", "algbw", "busbw") if c not in words]:
                    raise ValueError(
                        f"{source}:{number}: the table's header names no {' or '.join(missing)} "
                        "column; is the header line cut or edited?"
                    )
                if run.columns is not None:
                    runs.append(run.finish(source, len(runs) + 1))
                    run = _Builder()
                run.columns, run.header_line = words, number
                continue
            if _FOOTER.match(stripped) and run.columns is not None:
                run.footer = True
            elif _FOOTER.match(stripped):
                orphan_footer = orphan_footer or number
            elif (m := _CONCLUDED.search(stripped)) and run.columns and run.collective is None:
                run.collective = m.group(1)  # an excerpt from the table down names its test
            if stripped.startswith("#"):
                continue
        if not stripped[0].isdigit():
            if set(stripped) == {"."} and len(stripped) >= 3 and run.ranks and run.columns is None:
                run.elided = True
            continue  # NCCL INFO lines, launcher messages, versions
        in_table = run.columns is not None and not run.footer
        if _DEBUG.search(stripped) and not (in_table and _opens_row(stripped.split())):
            continue  # a log line of a host whose name starts with a digit
        if not in_table and not _opens_row(stripped.split()):
            continue  # a launcher's line outside a table: a hostfile's IP address, a count
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
    if not runs and orphan_footer:
        raise ValueError(
            f"{source}:{orphan_footer}: a '# Avg bus bandwidth' footer with no table above it "
            "(the rows and their header were cut from the log); give the whole output"
        )
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


def read_logs(
    paths: Sequence[str | Path], run: str | None = None, collective: str | None = None
) -> list[NcclTestsLog]:
    """Read every log of a command line, each narrowed to one run.

    Args:
        paths: The files, in the order given (a repeated path is refused: it would count twice).
        run: ``None`` (each file must hold one run), ``"all"`` (each run of each file is a log of
            its own) or ``"K"`` (run K of every file).
        collective: The collective asked for: without ``"K"``, the runs of a file of several
            that cannot be of it (:func:`runs_as`) are set aside (:attr:`NcclTestsLog.set_aside`),
            so a file of five collectives gives the one asked for.

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
        if collective is not None and run in (None, "all") and len(log.runs) > 1:
            kept = tuple(r for r in log.runs if runs_as(r, collective))
            if kept:
                aside = tuple(r for r in log.runs if r.index not in {k.index for k in kept})
                log = replace(log, runs=kept, set_aside=aside)
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
