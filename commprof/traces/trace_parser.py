"""Chrome / Kineto trace -> classified int64 interval sets, step windows and collectives.

Reads any Kineto trace (``torch.profiler`` export, ``.json`` or ``.json.gz``), not
only the ones commprof's harness writes: :func:`parse_trace` is the front door and
:class:`ParsedTrace` its result. Each complete event (``ph == "X"``) is classified by the
first matching rule of its regime's :class:`RuleTable` (:mod:`commprof.traces.event_classes`);
the collectives table (:mod:`commprof.traces.collectives`) takes collective metadata from the
event args before name patterns, which are only a fallback. Timestamps are float
microseconds in the file and are converted once, at the reader, to int64
nanoseconds (``np.rint(ts * 1000)``; docs/design.md, Definitions).

Files are decoded by msgspec in chunks of whole events into typed structs of the
fields used (:mod:`commprof.traces.trace_reader`, :mod:`commprof.traces.column_builder`):
peak memory stays at a few compact columns per event plus one chunk, however large the
trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.collectives import collectives_table
from commprof.traces.column_builder import read_columns
from commprof.traces.comm_rules import CommRules
from commprof.traces.event_classes import (
    Events,
    class_sets,
    classify,
    counted_names,
    unlaunched_events,
)
from commprof.traces.intervals import Int64Array, IntervalSet, difference
from commprof.traces.possible_comm import possible_comm, possible_ranges
from commprof.traces.trace_columns import code_mask
from commprof.traces.trace_reader import CHUNK_BYTES, load_trace
from commprof.traces.trace_rules import (
    CLASSES,
    DEFAULT_COMM,
    GRAPH_LAUNCH_PATTERN,
    IGNORE,
    LAUNCH_CALL_PATTERN,
    LAUNCH_CATS,
    LAUNCHED_CATS,
    MAX_EVENT_DURATION_US,
    REGIMES,
    RULES,
    UNLAUNCHED_RULES,
    Rule,
    RuleTable,
    candidate_tables,
    detect_regime,
)
from commprof.traces.windows import (
    LAUNCH_SOURCE,
    cpu_step_windows,
    launch_windows,
    step_index,
    step_windows,
)

__all__ = [
    "CLASSES",
    "IGNORE",
    "LAUNCH_CATS",
    "MAX_EVENT_DURATION_US",
    "REGIMES",
    "RULES",
    "ParsedTrace",
    "Rule",
    "RuleTable",
    "detect_regime",
    "load_trace",
    "parse_trace",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedTrace:
    """Classified intervals, step windows and collectives of one rank's trace."""

    source: str
    """File the trace came from ("<dict>" when parsed from memory)."""
    rank: int
    """Rank: distributedInfo, else the file name (rank<N>), else 0."""
    world_size: int | None
    """World size from distributedInfo, if present."""
    regime: str
    """Rule table used (detected or forced)."""
    step_ids: Int64Array
    """Step numbers (from ProfilerStep#N), one per window."""
    step_start_ns: Int64Array
    """Window starts (ns)."""
    step_end_ns: Int64Array
    """Window ends (ns)."""
    step_source: str
    """Where the windows came from: "ProfilerStep" (the CPU-side annotations), "device
    ProfilerStep" (GPU-side ones, used only where they hold the kernels; windows.py), or
    "whole trace"."""
    classes: dict[str, IntervalSet]
    """Interval set of each class in CLASSES."""
    collectives: pd.DataFrame = field(repr=False)
    """One row per collective: name, collective_type, start_ns, end_ns, duration_ns, step, seq,
    num_bytes, process_group, thread, group_size, type_source, library, point_to_point.
    ``step`` is the step whose
    ProfilerStep launched it, else the window it starts in, else NA (outside every window);
    type, group, size and sequence number come from the event's own args, else from its
    launching op (``type_source``: "args", "launching op", "op name", "event name"), unless the
    communication rule that claims the kernel types it by its name ("event name") or fixes it
    ("rule"); ``library`` and ``point_to_point`` are that rule's ("" and False where none)."""
    unlaunched_rule: str = "keep"
    """What was done with device activities whose launch is not in the trace: "keep" or "drop"."""
    num_unlaunched: int = 0
    """Device activities (kernels, memcpy, memset) with no launch event in the trace."""
    unlaunched_ns: int = 0
    """Their summed duration (ns)."""
    unlaunched_comm_ns: int = 0
    """The part of it in communication kernels (ns)."""
    num_duplicates: int = 0
    """Events dropped as exact duplicates of another (same category, name, start, end, thread)."""
    num_unfinished: int = 0
    """Events dropped as unfinished (the profiler saw an op's start or end, not both)."""
    control_chars_at: tuple[int, ...] = ()
    """Where the JSON held raw control characters inside strings, read leniently (byte offsets;
    ``TraceColumns.control_chars_at``)."""
    num_launch_calls: int = 0
    """Runtime calls that launch device work (``cudaLaunchKernel``, ``cudaGraphLaunch``, ...)."""
    num_graph_launches: int = 0
    """Of them, graph replays (``cudaGraphLaunch``, ``hipGraphLaunch``)."""
    num_device_events: int = 0
    """Device activities in the trace (kernels, memcpy, memset)."""
    num_launched: int = 0
    """Device activities whose launch is in the trace."""
    gpu_lag_ns: int | None = None
    """Median of (device activity start - its launch's start): how far the GPU runs behind the
    CPU (None without launched activities)."""
    has_backward: bool = False
    """A backward pass or an optimizer step shows in the kept names (training, not inference)."""
    counted: pd.DataFrame | None = field(default=None, repr=False)
    """What each class holds: per class its names with the most time (class, name,
    num_events, time_ns), at most ``event_classes.COUNTED_TOP`` of a class
    (:func:`commprof.traces.event_classes.counted_names`)."""
    possible_comm: pd.DataFrame | None = field(default=None, repr=False)
    """Kernels counted as compute that may be communication (no rule claims them; name,
    num_events, time_ns, why, rule_line: :func:`commprof.traces.possible_comm.possible_comm`);
    None in the regimes whose communication is not kernels."""
    possible_ranges: pd.DataFrame | None = field(default=None, repr=False)
    """Host ranges named like communication that nothing counted accounts for (name,
    num_ranges, host_ns: CPU time, never kernel time;
    :func:`commprof.traces.possible_comm.possible_ranges`); None where ``possible_comm`` is."""

    @property
    def outside(self) -> pd.DataFrame:
        """The collectives in no step (launched outside every step and running outside every
        window)."""
        return self.collectives[self.collectives["step"].isna()]


def _rank_of(trace: dict[str, Any], source: str) -> int:
    info = trace.get("distributedInfo") or {}
    if isinstance(info.get("rank"), int):
        return int(info["rank"])
    match = re.search(r"rank[_-]?(\d+)", Path(source).name)
    return int(match.group(1)) if match else 0


TRAINING_NAMES = re.compile(r"(?i).*(backward|autograd::engine|optimizer)")
"""Names that show a training step (a backward pass or an optimizer step), not inference."""
LAUNCH_WINDOW_REGIMES = frozenset({"cuda-nccl", "cuda-single"})
"""Regimes whose communication and compute are device activities: their step windows follow
the GPU through the launches (in cuda-gloo the communication is host time, in CPU windows)."""


def parse_trace(
    trace: Path | str | dict[str, Any],
    *,
    regime: str | None = None,
    rules: RuleTable | None = None,
    source: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    unlaunched: str = "keep",
    comm_rules: CommRules | None = None,
) -> ParsedTrace:
    """Classify a trace's events into interval sets per class and find its step windows.

    A file is decoded in chunks (bounded memory,
    :func:`commprof.traces.column_builder.read_columns`);
    a dict is read in place. Both give the same result.

    Args:
        trace: A trace file path or an already loaded trace dict.
        regime: Force a regime (one of REGIMES); detected from the trace if None.
        rules: A custom rule table; overrides ``RULES[regime]``.
        source: Name of the trace for messages and the rank fallback (default:
            the path, or "<dict>").
        chunk_bytes: Bytes of a file's text decoded at a time.
        unlaunched: Device activities with no launch event in the trace (launched before
            profiling started): "keep" them (the default; they ran inside the profiled time)
            or "drop" them (HolisticTraceAnalysis' rule). docs/design.md, Definitions.
        comm_rules: Which kernels are communication (default: the shipped rules,
            :func:`commprof.traces.comm_rules.default_rules`; ``resolve_rules`` adds a user's).

    Returns:
        The :class:`ParsedTrace`.

    Raises:
        ValueError: For unreadable or corrupt traces and unknown regimes.
    """
    if source is None:
        source = "<dict>" if isinstance(trace, dict) else str(trace)
    if unlaunched not in UNLAUNCHED_RULES:
        raise ValueError(f"unlaunched must be one of {UNLAUNCHED_RULES}, got {unlaunched!r}")
    tables = candidate_tables(regime, rules, comm_rules)  # validates regime before reading
    cols = read_columns(trace, tables, source=source, chunk_bytes=chunk_bytes)
    evs = Events(cols)
    meta = cols.meta
    if regime is None:
        comm_kernel = re.compile((comm_rules or DEFAULT_COMM).comm_pattern())
        regime = (
            rules.regime
            if rules is not None
            else detect_regime(meta, evs.cats, evs.names, comm_kernel)
        )
    if rules is None:
        rules = {t.regime: t for t in tables}.get(regime, RULES[regime])
    orphan = unlaunched_events(evs)
    targets, collective, not_compute = classify(evs, rules, orphan & (unlaunched == "drop"))
    if unlaunched == "keep":  # classify them (again) to count their communication time
        comm_orphans = orphan & (targets == CLASSES.index("communication"))
    else:
        comm = CLASSES.index("communication")
        comm_orphans = orphan & (classify(evs, rules, ~orphan)[0] == comm)

    def summed(mask: npt.NDArray[np.bool_]) -> int:
        return int((evs.end_ns[mask] - evs.start_ns[mask]).sum())

    classes, carve = class_sets(evs, targets, not_compute)
    if len(carve):
        classes["compute"] = difference(classes["compute"], carve)
    work = [classes["communication"], classes["compute"]]
    cpu = cpu_step_windows(cols)
    device = np.flatnonzero(evs.cat_mask(LAUNCHED_CATS))
    launch = evs.launch_of(device)
    found = launch >= 0
    launch_start = cols.launch_start_ns[launch[found]]
    dev_step = np.full(device.size, -1, np.intp)
    dev_step[found] = step_index(cpu, launch_start, np.ones(launch_start.size, bool))
    if cpu is not None and regime in LAUNCH_WINDOW_REGIMES and (dev_step >= 0).any():
        ids, starts, ends = launch_windows(cpu, dev_step, evs.start_ns[device], evs.end_ns[device])
        label = LAUNCH_SOURCE
    else:
        ids, starts, ends, label = step_windows(cols, targets, work, source)
    lag = evs.start_ns[device[found]] - launch_start
    names = cols.names
    call = [LAUNCH_CALL_PATTERN.match(str(n)) is not None for n in names]
    graph = [GRAPH_LAUNCH_PATTERN.match(str(n)) is not None for n in names]
    info = meta.get("distributedInfo") or {}
    world_size = int(info["world_size"]) if isinstance(info.get("world_size"), int) else None
    collectives = collectives_table(
        evs, np.flatnonzero(collective), (ids, starts, ends), cpu, rules.comm
    )
    types = frozenset(map(str, collectives["collective_type"].unique()))
    possible = _possible(evs, targets, rules.comm, types)
    return ParsedTrace(
        source=source,
        rank=_rank_of(meta, source),
        world_size=1 if world_size is None and regime == "cuda-single" else world_size,
        regime=regime,
        step_ids=ids.astype(np.int64),
        step_start_ns=starts.astype(np.int64),
        step_end_ns=ends.astype(np.int64),
        step_source=label,
        classes=classes,
        collectives=collectives,
        unlaunched_rule=unlaunched,
        num_unlaunched=int(orphan.sum()),
        unlaunched_ns=summed(orphan),
        unlaunched_comm_ns=summed(comm_orphans),
        num_duplicates=cols.num_duplicates,
        num_unfinished=cols.num_unfinished,
        control_chars_at=cols.control_chars_at,
        num_launch_calls=int(code_mask(cols.launch_name_code, call).sum()),
        num_graph_launches=int(code_mask(cols.launch_name_code, graph).sum()),
        num_device_events=int(device.size),
        num_launched=int(found.sum()),
        gpu_lag_ns=int(np.median(lag)) if lag.size else None,
        has_backward=any(TRAINING_NAMES.match(str(n)) for n in names),
        counted=counted_names(evs, targets),
        possible_comm=possible[0],
        possible_ranges=possible[1],
    )


def _possible(
    evs: Events, targets: npt.NDArray[np.int8], comm: CommRules | None, types: frozenset[str]
) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The possible communication not counted, kernels and host ranges
    (:mod:`commprof.traces.possible_comm`; ``types``: the counted collectives' types); None
    where the rules have no communication rules."""
    if comm is None:
        return None, None
    launch = np.full(len(evs), -1, np.intp)
    kernels = np.flatnonzero(evs.cat_mask(frozenset({"kernel"})))
    launch[kernels] = evs.launch_of(kernels)
    return possible_comm(evs.cols, targets, comm, launch), possible_ranges(
        evs.cols, targets, launch, types
    )
