"""Chrome / Kineto trace -> classified int64 interval sets, step windows and collectives.

Reads any Kineto trace (``torch.profiler`` export, ``.json`` or ``.json.gz``), not
only the ones commprof's harness writes. Each complete event (``ph == "X"``) is
classified by the first matching rule of its regime's :class:`RuleTable`
(``RULES``: cpu-gloo, cuda-nccl, cuda-gloo); collective metadata in the event args
(``Collective name``, ``Process Group Name``, ``Seq``) comes before name patterns,
which are only a fallback. Timestamps are float microseconds in the file and are
converted once, here, to int64 nanoseconds (``np.rint(ts * 1000)``; DESIGN.md).

For speed on traces of a million events nothing is built per event beyond what
the JSON decoder makes: fields are pulled into numpy arrays, names and categories
are factorised, and rules are evaluated on the distinct values.
"""

from __future__ import annotations

import gzip
import json
import re
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.profiling.intervals import Int64Array, IntervalSet, difference

try:  # orjson decodes about 2-3x faster than json on big traces; optional.
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]

CLASSES = ("communication", "compute", "memcpy", "memset", "sync", "other")
"""Event classes a rule can assign; ``"ignore"`` drops an event."""
IGNORE = "ignore"
REGIMES = ("cpu-gloo", "cuda-nccl", "cuda-gloo")
MAX_EVENT_DURATION_US = 86_400e6
"""Longest plausible event (one day, in microseconds); longer ones are rejected as corrupt."""
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"})
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
STEP_PATTERN = re.compile(r"^ProfilerStep#(\d+)$")
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "int": 4, "int32": 4,
    "long": 8, "long int": 8, "int64": 8, "short": 2, "int16": 2, "char": 1,
    "signed char": 1, "unsigned char": 1, "byte": 1, "uint8": 1, "int8": 1, "bool": 1,
}  # fmt: skip
"""Element sizes of the dtype spellings in Kineto args (``dtype`` and ``Input type``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One row of a rule table: an event predicate and the class it assigns.

    All given predicates must hold; ``None`` means "any".
    """

    target: str
    """Class assigned: one of CLASSES, or "ignore"."""
    why: str
    """One line saying what the rule catches (shown to users extending tables)."""
    cats: frozenset[str] | None = None
    """Event categories (``cat``), exact."""
    name: str | None = None
    """Regular expression that must match the start of the event name."""
    has_arg: str | None = None
    """Key that must be present in the event's ``args`` (collective metadata)."""
    comm_thread: bool | None = None
    """True: event on (or launched from) a communication thread; False: not."""
    collective: bool = False
    """Each matching event is one collective (a row of ``ParsedTrace.collectives``)."""
    not_compute: bool = False
    """Carve the event's time out of compute even where a compute event encloses it."""

    def __post_init__(self) -> None:
        if self.target not in CLASSES and self.target != IGNORE:
            raise ValueError(
                f"Rule.target must be one of {CLASSES} or 'ignore', got {self.target!r}"
            )
        if self.name is not None:
            re.compile(self.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleTable:
    """Ordered rules of one regime; the first matching rule wins, unmatched events are ignored."""

    regime: str
    """Regime name, e.g. "cpu-gloo"."""
    rules: tuple[Rule, ...]
    """Rules in priority order."""
    comm_thread_marker: str | None = None
    """Regex on event names; a thread with such an event is a communication thread."""


_GLOO = r"gloo:"
_NCCL_KERNEL = r"nccl(Dev)?Kernel"
RULES: dict[str, RuleTable] = {
    "cpu-gloo": RuleTable(
        regime="cpu-gloo",
        comm_thread_marker=_GLOO,
        rules=(
            Rule(target="communication", cats=frozenset({"user_annotation"}), name=_GLOO,
                 collective=True, why="gloo collective on a gloo worker thread (transfer time)"),
            Rule(target=IGNORE, cats=frozenset({"cpu_op"}), comm_thread=True,
                 why="ops inside a gloo worker's collective are part of the transfer"),
            Rule(target="other", cats=frozenset({"cpu_op"}), name=r"(c10d::|record_param_comms)",
                 not_compute=True, why="collective enqueue on the main thread, not compute"),
            Rule(target="compute", cats=frozenset({"cpu_op"}), comm_thread=False,
                 why="forward, backward and optimizer ops on the training threads"),
        ),
    ),
    "cuda-nccl": RuleTable(
        regime="cuda-nccl",
        rules=(
            Rule(target="communication", cats=frozenset({"kernel"}), has_arg="Collective name",
                 collective=True, why="kernel with collective metadata in its args"),
            Rule(target="communication", cats=frozenset({"kernel"}), name=_NCCL_KERNEL,
                 collective=True, why="fallback: NCCL kernel name (ncclKernel*, ncclDevKernel*)"),
            Rule(target="compute", cats=frozenset({"kernel"}), why="every other GPU kernel"),
            Rule(target="memcpy", cats=frozenset({"gpu_memcpy"}), why="device copies"),
            Rule(target="memset", cats=frozenset({"gpu_memset"}), why="device memsets"),
            Rule(target="sync", cats=frozenset({"cuda_sync"}), why="device-side waits"),
        ),
    ),
    "cuda-gloo": RuleTable(
        regime="cuda-gloo",
        comm_thread_marker=_GLOO,
        rules=(
            Rule(target="communication", cats=frozenset({"user_annotation"}), name=_GLOO,
                 collective=True, why="gloo collective on a host worker thread"),
            Rule(target="communication", cats=frozenset({"gpu_memcpy"}), comm_thread=True,
                 why="device<->host staging copies launched by gloo threads"),
            Rule(target="compute", cats=frozenset({"kernel"}), why="GPU kernels"),
            Rule(target="memcpy", cats=frozenset({"gpu_memcpy"}), why="other device copies"),
            Rule(target="memset", cats=frozenset({"gpu_memset"}), why="device memsets"),
            Rule(target="sync", cats=frozenset({"cuda_sync"}), why="device-side waits"),
        ),
    ),
}  # fmt: skip
"""The rule table of each regime; extend one with ``dataclasses.replace``."""


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
    """Where the windows came from: "ProfilerStep", "device ProfilerStep", "whole trace"."""
    classes: dict[str, IntervalSet]
    """Interval set of each class in CLASSES."""
    collectives: pd.DataFrame = field(repr=False)
    """One row per collective: name, start_ns, end_ns, duration_ns, step, seq, num_bytes,
    process_group, thread."""


def load_trace(path: Path | str) -> dict[str, Any]:
    """Read a Chrome trace (``.json`` or gzip-compressed) into a dict with ``traceEvents``.

    Args:
        path: Trace file; gzip is recognised by content, not by the suffix.

    Returns:
        The decoded trace; a bare JSON array of events is wrapped as ``traceEvents``.

    Raises:
        ValueError: If the file is empty, truncated, not JSON or holds no events.
    """
    p = Path(path)
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise ValueError(
                f"{p}: truncated or corrupt gzip ({exc}); re-export the trace"
            ) from exc
    if not raw.strip():
        raise ValueError(f"{p}: empty file, not a trace")
    try:
        data = _orjson.loads(raw) if _orjson is not None else json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and orjson's error are ValueErrors
        raise ValueError(f"{p}: not valid JSON, perhaps truncated ({exc})") from exc
    if isinstance(data, list):  # Chrome's JSON Array Format: a bare list of events
        if data and not any(isinstance(e, dict) and "ph" in e for e in data[:100]):
            raise ValueError(f"{p}: JSON list without 'ph' fields, not a Chrome trace")
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{p}: JSON without a 'traceEvents' list, not a Chrome trace")
    if not data["traceEvents"]:
        raise ValueError(f"{p}: trace has no events")
    return data


def detect_regime(trace: dict[str, Any], cats: set[str], names: list[str]) -> str:
    """Guess the regime from distributedInfo's backend and the presence of device events."""
    backend = str((trace.get("distributedInfo") or {}).get("backend", "")).lower()
    has_device = bool(cats & {"kernel", "gpu_memcpy", "gpu_memset"})
    if "nccl" in backend:
        return "cuda-nccl"
    if "gloo" in backend:
        return "cuda-gloo" if has_device else "cpu-gloo"
    nccl_re = re.compile(_NCCL_KERNEL)
    if has_device:
        return "cuda-nccl" if any(nccl_re.match(n) for n in names) else "cuda-gloo"
    return "cpu-gloo"


def _rank_of(trace: dict[str, Any], source: str) -> int:
    info = trace.get("distributedInfo") or {}
    if isinstance(info.get("rank"), int):
        return int(info["rank"])
    match = re.search(r"rank[_-]?(\d+)", Path(source).name)
    return int(match.group(1)) if match else 0


def _floats(values: list[Any], key: str, source: str) -> npt.NDArray[np.float64]:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        pass
    # Slow path only for bad input: missing values become NaN (rejected by the caller).
    try:
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: non-numeric '{key}' in an event ({exc})") from exc


def _dtype_bytes(name: Any) -> int | None:
    return DTYPE_BYTES.get(str(name).lower()) if name is not None else None


def _message_bytes(args: dict[str, Any] | None) -> int | None:
    # Collective metadata (NCCL kernels, record_param_comms) first, then the
    # input shape that record_shapes=True attaches to gloo annotations.
    if not args:
        return None
    nelems, size = args.get("In msg nelems"), _dtype_bytes(args.get("dtype"))
    if isinstance(nelems, int) and size is not None:
        return nelems * size
    dims, types = args.get("Input Dims"), args.get("Input type")
    if dims and types and isinstance(dims[0], list):
        size = _dtype_bytes(types[0])
        if size is not None and all(isinstance(d, int) for d in dims[0]):
            return int(np.prod(dims[0], dtype=np.int64)) * size
    return None


def _factorize(values: list[Any]) -> tuple[npt.NDArray[np.intp], list[Any]]:
    """Integer codes and distinct values (pid/tid may mix ints and strings)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    codes, uniques = pd.factorize(arr)
    return codes, list(uniques)


class _Events:
    """Columns of the complete ("X") events of a trace."""

    def __init__(self, trace: dict[str, Any], source: str) -> None:
        self.ev = [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
        if not self.ev:
            raise ValueError(f"{source}: trace has no complete ('X') events")
        # One list comprehension per field: cheaper than transposing tuples with zip(*).
        ev = self.ev
        ts_us = [e.get("ts") for e in ev]
        dur_us = [e.get("dur") for e in ev]
        cat = [e.get("cat", "") for e in ev]
        name = [e.get("name", "") for e in ev]
        pid = [e.get("pid") for e in ev]
        tid = [e.get("tid") for e in ev]
        ts, dur = _floats(ts_us, "ts", source), _floats(dur_us, "dur", source)
        bad = np.flatnonzero(
            ~np.isfinite(ts) | ~np.isfinite(dur) | (dur < 0) | (dur > MAX_EVENT_DURATION_US)
        )
        if bad.size:
            e = self.ev[int(bad[0])]
            raise ValueError(
                f"{source}: {bad.size} event(s) with missing, negative or absurd ts/dur "
                f"(first: {e.get('name')!r} ts={e.get('ts')!r} dur={e.get('dur')!r}); "
                "the trace is corrupt, re-export it"
            )
        self.start_ns = np.rint(ts * 1000.0).astype(np.int64)  # us -> ns, rounded
        self.end_ns = self.start_ns + np.rint(dur * 1000.0).astype(np.int64)
        self.cat_code, self.cats = _factorize(cat)
        self.name_code, self.names = _factorize(name)
        pid_code, _ = _factorize(pid)
        tid_code, tids = _factorize(tid)
        self.thread = pid_code.astype(np.int64) * (len(tids) + 1) + tid_code

    def __len__(self) -> int:
        return len(self.ev)

    def cat_mask(self, cats: frozenset[str] | None) -> npt.NDArray[np.bool_]:
        if cats is None:
            return np.ones(len(self), bool)
        return np.isin(self.cat_code, [i for i, c in enumerate(self.cats) if c in cats])

    def name_mask(self, pattern: str | None) -> npt.NDArray[np.bool_]:
        if pattern is None:
            return np.ones(len(self), bool)
        rx = re.compile(pattern)
        return np.isin(self.name_code, [i for i, n in enumerate(self.names) if rx.match(str(n))])

    def has_arg(self, idx: npt.NDArray[np.intp], key: str) -> npt.NDArray[np.bool_]:
        return np.fromiter((key in (self.ev[i].get("args") or {}) for i in idx), bool, idx.size)

    def launch_thread(self, idx: npt.NDArray[np.intp]) -> npt.NDArray[np.int64]:
        # Device events carry no thread of their own: map them through the CUPTI
        # correlation id to the runtime call that launched them (-1 if none).
        launch = np.flatnonzero(self.cat_mask(LAUNCH_CATS))
        corr_of = lambda ii: np.fromiter(  # noqa: E731
            ((self.ev[i].get("args") or {}).get("correlation", -1) for i in ii), np.int64, ii.size
        )
        out = self.thread[idx].copy()
        device = self.cat_mask(DEVICE_CATS)[idx]
        if not device.any():
            return out
        lc = corr_of(launch)
        order = np.argsort(lc)
        lc, lthread = lc[order], self.thread[launch][order]
        dc = corr_of(idx[device])
        pos = np.clip(np.searchsorted(lc, dc), 0, max(lc.size - 1, 0))
        found = (lc.size > 0) & (lc[pos] == dc) if lc.size else np.zeros(dc.size, bool)
        out[device] = np.where(found, lthread[pos] if lc.size else -1, -1)
        return out


def _classify(
    evs: _Events, table: RuleTable
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Class index per event (-1 unmatched or ignored), collective flags, not-compute flags."""
    targets = np.full(len(evs), -1, np.int64)
    decided = np.zeros(len(evs), bool)
    collective = np.zeros(len(evs), bool)
    not_compute = np.zeros(len(evs), bool)
    comm_threads = np.empty(0, np.int64)
    if table.comm_thread_marker is not None:
        comm_threads = np.unique(evs.thread[evs.name_mask(table.comm_thread_marker)])
    for rule in table.rules:
        idx = np.flatnonzero(~decided & evs.cat_mask(rule.cats) & evs.name_mask(rule.name))
        if rule.has_arg is not None and idx.size:
            idx = idx[evs.has_arg(idx, rule.has_arg)]
        if rule.comm_thread is not None and idx.size:
            on_comm = np.isin(evs.launch_thread(idx), comm_threads)
            idx = idx[on_comm == rule.comm_thread]
        decided[idx] = True
        targets[idx] = -1 if rule.target == IGNORE else CLASSES.index(rule.target)
        collective[idx] = rule.collective
        not_compute[idx] = rule.not_compute
    return targets, collective, not_compute


def _step_windows(
    evs: _Events, targets: npt.NDArray[np.int64], regime: str, source: str
) -> tuple[Int64Array, Int64Array, Int64Array, str]:
    step_names = [
        (i, int(m.group(1))) for i, n in enumerate(evs.names) if (m := STEP_PATTERN.match(str(n)))
    ]
    if step_names:
        codes = np.array([i for i, _ in step_names])
        step_of_code = dict(step_names)
        sel = np.flatnonzero(np.isin(evs.name_code, codes))
        on_device = evs.cat_mask(frozenset({"gpu_user_annotation"}))[sel]
        label = "ProfilerStep"
        if regime == "cuda-nccl" and on_device.any():
            sel, label = sel[on_device], "device ProfilerStep"
        else:
            sel = sel[~on_device]
        frame = pd.DataFrame({
            "step": [step_of_code[int(c)] for c in evs.name_code[sel]],
            "start": evs.start_ns[sel], "end": evs.end_ns[sel],
        }).groupby("step").agg(start=("start", "min"), end=("end", "max"))  # fmt: skip
        ids = frame.index.to_numpy(np.int64)
        start, end = frame["start"].to_numpy(np.int64), frame["end"].to_numpy(np.int64)
        if np.any(start[1:] < end[:-1]):
            raise ValueError(
                f"{source}: ProfilerStep windows overlap; cannot assign events to steps"
            )
        return ids, start, end, label
    classified = targets >= 0
    if not classified.any():
        raise ValueError(f"{source}: no ProfilerStep annotations and no classified events")
    warnings.warn(
        f"{source}: no ProfilerStep#N annotations; using one window (step 0) over the whole trace",
        stacklevel=3,
    )
    lo, hi = evs.start_ns[classified].min(), evs.end_ns[classified].max()
    return np.array([0]), np.array([lo]), np.array([hi]), "whole trace"


def _collectives(
    evs: _Events, idx: npt.NDArray[np.intp], starts: Int64Array, ends: Int64Array, ids: Int64Array
) -> pd.DataFrame:
    args = [evs.ev[i].get("args") or {} for i in idx]
    start, end = evs.start_ns[idx], evs.end_ns[idx]
    win = np.searchsorted(starts, start, side="right") - 1
    inside = (win >= 0) & (start < ends[np.clip(win, 0, None)])
    frame = pd.DataFrame({
        "name": [
            a.get("Collective name") or evs.ev[i].get("name", "")
            for a, i in zip(args, idx, strict=True)
        ],
        "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "step": pd.array(np.where(inside, ids[np.clip(win, 0, None)], 0), dtype="Int64"),
        "seq": pd.array(
            [a.get("Seq") if isinstance(a.get("Seq"), int) else None for a in args], dtype="Int64"
        ),
        "num_bytes": pd.array([_message_bytes(a) for a in args], dtype="Int64"),
        "process_group": [str(a.get("Process Group Name", "")) for a in args],
        "thread": evs.thread[idx],
    })  # fmt: skip
    frame.loc[~inside, "step"] = pd.NA
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


def parse_trace(
    trace: Path | str | dict[str, Any],
    *,
    regime: str | None = None,
    rules: RuleTable | None = None,
    source: str | None = None,
) -> ParsedTrace:
    """Classify a trace's events into interval sets per class and find its step windows.

    Args:
        trace: A trace file path or an already loaded trace dict.
        regime: Force a regime (one of REGIMES); detected from the trace if None.
        rules: A custom rule table; overrides ``RULES[regime]``.
        source: Name of the trace for messages and the rank fallback (default:
            the path, or "<dict>").

    Returns:
        The :class:`ParsedTrace`.

    Raises:
        ValueError: For unreadable or corrupt traces and unknown regimes.
    """
    if source is None:
        source = "<dict>" if isinstance(trace, dict) else str(trace)
    data = trace if isinstance(trace, dict) else load_trace(trace)
    if not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{source}: trace dict needs a 'traceEvents' list")
    evs = _Events(data, source)
    if regime is None:
        regime = (
            rules.regime
            if rules is not None
            else detect_regime(data, set(evs.cats), list(evs.names))
        )
    if rules is None:
        if regime not in RULES:
            raise ValueError(f"regime must be one of {sorted(RULES)}, got {regime!r}")
        rules = RULES[regime]
    targets, collective, not_compute = _classify(evs, rules)
    classes = {
        c: IntervalSet.from_arrays(evs.start_ns[targets == k], evs.end_ns[targets == k])
        for k, c in enumerate(CLASSES)
    }
    carve = IntervalSet.from_arrays(evs.start_ns[not_compute], evs.end_ns[not_compute])
    if len(carve):
        classes["compute"] = difference(classes["compute"], carve)
    ids, starts, ends, label = _step_windows(evs, targets, regime, source)
    info = data.get("distributedInfo") or {}
    return ParsedTrace(
        source=source,
        rank=_rank_of(data, source),
        world_size=int(info["world_size"]) if isinstance(info.get("world_size"), int) else None,
        regime=regime,
        step_ids=ids.astype(np.int64),
        step_start_ns=starts.astype(np.int64),
        step_end_ns=ends.astype(np.int64),
        step_source=label,
        classes=classes,
        collectives=_collectives(evs, np.flatnonzero(collective), starts, ends, ids),
    )
