"""nccl-tests' JSON output (``-J FILE``, nccl-tests 2.17 and later): one run, read as its text.

nccl-tests writes, beside its text table, a JSON file of the same run (``util.cu``,
``JSON_FILE_VERSION`` 1 to 3): ``args`` (its command line: ``args[0]`` names the test),
``config`` (``nthreads``, ``ngpus`` and ``devices``: the first rank of each process, as its
``#  Rank`` line), ``results`` (one record a size: ``size``, ``count``, ``type``, ``redop``,
``root``, and ``out_of_place`` / ``in_place`` with ``time`` or ``cpu_time`` in us, ``alg_bw``,
``bus_bw`` and ``nwrong``, null without validation) and ``average_bus_bandwidth`` (its footer).
Fields it added later (per-iteration statistics) are not read, so every version reads alike.

The file is decoded by msgspec into the types below, never evaluated; a file that is not of
that shape is refused naming the file and the field (``$.results[3].size``). A record's place in
``results`` (1-based) stands for a text table's line number. What the text reader skips and
counts (0-byte sizes, non-zero ``nwrong``) is skipped and counted here the same way.
"""

from __future__ import annotations

import re

import msgspec

from commprof.modeling.collective.nccl_log_collective import named_by_table
from commprof.modeling.collective.nccl_log_runs import NcclTestsLog, Row, Run, Skipped

_TEST = re.compile(r"(\w+?)_perf(?:_mpi)?(?:\.exe)?$")
"""A test binary's name: ``all_reduce_perf`` (``_mpi`` where a site builds both)."""


class _Half(msgspec.Struct, frozen=True):
    alg_bw: float | str
    bus_bw: float | str
    time: float | str | None = None
    cpu_time: float | str | None = None
    nwrong: float | str | None = None


class _Result(msgspec.Struct, frozen=True):
    size: int
    type: str
    redop: str
    root: str
    out_of_place: _Half | None = None
    in_place: _Half | None = None


class _Device(msgspec.Struct, frozen=True):
    rank: int
    hostname: str


class _Config(msgspec.Struct, frozen=True):
    nthreads: int
    ngpus: int
    devices: list[_Device] = []


class _File(msgspec.Struct, frozen=True):
    version: int
    config: _Config
    args: list[str] = []
    results: list[_Result] = []
    average_bus_bandwidth: dict[str, object] | None = None


COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
"""The text table's header words that the JSON records carry."""


def looks_like_json(text: str) -> bool:
    """The text opens as a JSON object (nccl-tests ``-J``), not as a text log."""
    return text.lstrip()[:1] == "{"


def parse_json(text: str, source: str) -> NcclTestsLog:
    """Read nccl-tests' JSON output as a log of one run.

    Raises:
        ValueError: naming ``source`` and what is wrong: not JSON (a run cut short leaves it
            unfinished), not of nccl-tests' shape, or a size given twice.
    """
    try:
        data = msgspec.json.decode(text, type=_File)
    except msgspec.ValidationError as e:
        raise ValueError(f"{source}: not nccl-tests' JSON output (-J): {e}") from None
    except msgspec.DecodeError as e:
        raise ValueError(
            f"{source}: not valid JSON ({e}); a run cut short leaves its JSON unfinished: give "
            "its text output"
        ) from None
    rows: list[Row] = []
    skipped: list[Skipped] = []
    keys: set[tuple[int, str, str]] = set()
    roots: set[str] = set()
    for place, result in enumerate(data.results, start=1):
        half = result.out_of_place or result.in_place
        said = f"results[{place - 1}]: size {result.size}, {result.type}, {result.redop}"
        if result.size == 0:
            skipped.append(Skipped(line=place, kind="0 bytes", text=said))
            continue
        if half is None:
            raise ValueError(f"{source}: {said} has neither an out-of-place nor an in-place time")
        wrong = [h.nwrong for h in (result.out_of_place, result.in_place) if h is not None]
        if any(w not in (None, 0, 0.0) for w in wrong):
            skipped.append(Skipped(line=place, kind="#wrong", text=said))
            continue
        time_us = _number(half.time if half.time is not None else half.cpu_time, said, source)
        if not time_us > 0:
            raise ValueError(f"{source}: {said}: time {time_us} must be > 0 us")
        key = (result.size, result.type, result.redop)
        if key in keys:
            raise ValueError(
                f"{source}: {said} appears twice (nccl-tests -N repeats every size): give one "
                "cycle of the run"
            )
        keys.add(key)
        roots.add(result.root.strip())
        inplace = result.in_place if result.out_of_place is not None else None
        rows.append(
            Row(
                num_bytes=result.size,
                dtype=result.type,
                redop=result.redop,
                time_us=time_us,
                algbw_gbps=_number(half.alg_bw, said, source),
                busbw_gbps=_number(half.bus_bw, said, source),
                inplace_time_us=_inplace_time(inplace),
                line=place,
            )
        )
    if not rows and not skipped:
        raise ValueError(f"{source}: nccl-tests' JSON output with no results; the run printed none")
    devices = data.config.devices
    named = _TEST.search(data.args[0].rsplit("/", 1)[-1]) if data.args else None
    run = Run(
        index=1,
        header_line=1,
        collective=named.group(1) if named else None,
        world_size=len(devices) * data.config.nthreads * data.config.ngpus or None,
        num_hosts=len({d.hostname for d in devices}) or None,
        rows=tuple(rows),
        skipped=tuple(skipped),
        complete=data.average_bus_bandwidth is not None,
    )
    return NcclTestsLog(source=source, runs=(named_by_table(run, COLUMNS, roots),))


def _number(value: float | str | None, said: str, source: str) -> float:
    if isinstance(value, str) or value is None:  # nccl-tests writes NaN as the string "nan"
        raise ValueError(f"{source}: {said}: a time or bandwidth of {value!r}, not a number")
    return float(value)


def _inplace_time(half: _Half | None) -> float | None:
    if half is None:
        return None
    value = half.time if half.time is not None else half.cpu_time
    return float(value) if isinstance(value, int | float) else None
