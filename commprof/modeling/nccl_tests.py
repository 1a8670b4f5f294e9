"""nccl-tests / rccl-tests output as input: a strict reader.

The reader takes the text users already have, in any of the layouts those tools print: with or
without a ``root`` or ``redop`` column, ``#wrong`` or ``error`` columns, out-of-place and in-place
halves, mpirun's ``[1,0]<stdout>:`` prefix on every line, NCCL/RCCL log lines in between. The
header gives the ranks (one ``#  Rank`` line each) and their hosts; the table's own header line
names the columns, so a row is read by name, not by position. A log without a table, with a row
that does not parse, with a second table or without the ``# Avg bus bandwidth`` footer (a run
that did not finish) is refused with the file and line named.

Calibration of the model on these logs is :mod:`commprof.modeling.calibration`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from commprof.yamlio import read_text

_PREFIX = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_COLLECTIVE = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_FOOTER = re.compile(r"^#\s*Avg bus bandwidth\s*:")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """One message size of a log."""

    num_bytes: int
    """``size`` column (bytes)."""
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
class NcclTestsLog:
    """One nccl-tests run."""

    source: str
    """The file."""
    world_size: int | None
    """Ranks (``#  Rank`` lines); None where the log lists none."""
    num_hosts: int | None
    """Distinct hosts of those ranks."""
    collective: str | None
    """From ``Collective test starting: X_perf`` where printed, else None."""
    rows: tuple[Row, ...]
    """The table, in file order."""


def _strip(line: str) -> str:
    return _PREFIX.sub("", line.rstrip("\n"), count=1)


def _columns(header: str) -> list[str]:
    return header.lstrip("#").split()


def parse_text(text: str, source: str) -> NcclTestsLog:
    """Read one nccl-tests / rccl-tests output.

    Args:
        text: The log's text.
        source: Its name in error messages (a path).

    Returns:
        The parsed log.

    Raises:
        ValueError: naming ``source`` and the line when the log is not a complete table.
    """
    ranks: dict[int, str] = {}
    collective = None
    columns: list[str] | None = None
    header_line = 0
    rows: list[Row] = []
    footer = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip(raw)
        stripped = line.strip()
        if not stripped:
            continue
        if (m := _COLLECTIVE.search(stripped)) is not None:
            collective = m.group(1)
        if (m := _RANK.match(stripped)) is not None:
            ranks[int(m.group(1))] = m.group(2)
            continue
        if stripped.startswith("#"):
            words = _columns(stripped)
            if words[:2] == ["size", "count"] and "time" in words:
                if columns is not None:
                    raise ValueError(
                        f"{source}:{number}: a second table starts here (the first at line "
                        f"{header_line}); give each run its own file"
                    )
                columns, header_line = words, number
            elif _FOOTER.match(stripped):
                footer = True
            continue
        if not stripped[0].isdigit():
            continue  # NCCL INFO lines, mpirun warnings, RCCL version lines
        if columns is None:
            raise ValueError(
                f"{source}:{number}: a table row before any header line "
                "('#  size  count  type ... time  algbw  busbw ...'); is the log cut at the top?"
            )
        if footer:
            raise ValueError(f"{source}:{number}: a row after the '# Avg bus bandwidth' footer")
        rows.append(_row(stripped.split(), columns, source, number))
    if columns is None:
        raise ValueError(
            f"{source}: no nccl-tests table found (no header line '#  size  count  type ... time "
            "algbw  busbw'); give the output of all_reduce_perf or a sibling test"
        )
    if not rows:
        raise ValueError(f"{source}:{header_line}: the table has a header but no rows")
    if not footer:
        raise ValueError(
            f"{source}: ends after line {rows[-1].line} without the '# Avg bus bandwidth' footer: "
            "the run did not finish (a partial log); give a complete one"
        )
    sizes = [r.num_bytes for r in rows]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"{source}: a message size appears twice; give one run a file")
    if ranks and sorted(ranks) != list(range(len(ranks))):
        raise ValueError(f"{source}: rank lines are not 0..{len(ranks) - 1}; is the header cut?")
    return NcclTestsLog(
        source=source,
        world_size=len(ranks) or None,
        num_hosts=len(set(ranks.values())) or None,
        collective=collective,
        rows=tuple(rows),
    )


def _row(fields: list[str], columns: list[str], source: str, number: int) -> Row:
    if len(fields) != len(columns):
        raise ValueError(
            f"{source}:{number}: {len(fields)} fields where the header (columns {columns}) has "
            f"{len(columns)}; is the line cut?"
        )
    times = [i for i, c in enumerate(columns) if c == "time"]

    def number_at(i: int, what: str) -> float:
        text = fields[i]
        if not _NUMBER.match(text):
            raise ValueError(f"{source}:{number}: {what} {text!r} is not a number")
        return float(text)

    size = number_at(0, "size")
    if size <= 0 or size != int(size):
        raise ValueError(f"{source}:{number}: size {fields[0]!r} is not a positive whole number")
    first = times[0]
    time_us = number_at(first, "time")
    if not time_us > 0:
        raise ValueError(f"{source}:{number}: time {fields[first]!r} must be > 0 us")
    inplace = None
    if len(times) > 1 and _NUMBER.match(fields[times[1]]):
        inplace = float(fields[times[1]])
    return Row(
        num_bytes=int(size),
        time_us=time_us,
        algbw_gbps=number_at(first + 1, "algbw"),
        busbw_gbps=number_at(first + 2, "busbw"),
        inplace_time_us=inplace,
        line=number,
    )


def read_log(path: str | Path) -> NcclTestsLog:
    """Read one log file (see :func:`parse_text`)."""
    return parse_text(read_text(path, "the nccl-tests log"), str(path))


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
