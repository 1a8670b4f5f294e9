"""Every rank on one time axis: a merged Chrome trace for Perfetto or chrome://tracing.

``commprof analyze --perfetto OUT.json`` writes one trace of all the ranks of a folder. Each
rank is one process (pid = its rank, named "rank R"); each (pid, tid) of its own trace, a CPU
thread or a GPU stream, is one thread of that process, named after the rank's own process
and thread names. Every timestamp is moved onto the reference rank's clock by the offset the
cross-rank line-up estimated (:func:`commprof.traces.crossrank.clock_offsets`: ts - offset),
so the ends of one collective meet across ranks; ranks without a matched collective keep their
own clock (offset 0, said in the returned summary). The collectives of one (group, index) are
linked by flow events (Chrome's ``s``/``t``/``f``, category ``commprof_collective``) from the
first rank to the last, so the viewer draws one arrow through every rank of a collective. The
ranks' own flows (``ac2g`` launch to kernel, ``fwdbwd``) are kept with ids made unique per rank.

Each rank's trace is streamed again from its file, a chunk at a time, and written at once: the
memory is one chunk and the rank's table of collectives, whatever the number of ranks.
Perfetto merges traces with clock-sync markers of its own; no Kineto peer aligns ranks before
merging them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import pandas as pd

from commprof.traces.trace_reader import stream_trace

FLOW_CAT = "commprof_collective"
FLOW_ID_BASE = 1 << 40
"""First id of the collective flows: above the ranks' own flow ids (rank-unique, below it) and
below 2**53, where a JavaScript viewer still reads integer ids exactly."""
KEPT_PH = frozenset({"X", "B", "E", "i", "I", "C", "s", "t", "f", "b", "e", "n"})
"""Event phases copied; process and thread names ("M") are written anew per rank."""


class _Rank:
    """One rank's mapping of its (pid, tid) pairs onto the threads of its process."""

    def __init__(self, rank: int, offset_ns: int, num_ranks: int, index: int) -> None:
        self.rank, self.offset_ns = rank, offset_ns
        self.num_ranks, self.index = num_ranks, index
        self.threads: dict[tuple[Any, Any], int] = {}
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}

    def tid(self, pid: Any, tid: Any) -> int:
        key = (str(pid), str(tid))
        if key not in self.threads:
            self.threads[key] = len(self.threads) + 1
        return self.threads[key]

    def ts(self, ts_us: float) -> float:
        return round(ts_us * 1000.0 - self.offset_ns) / 1000.0

    def flow_id(self, flow: Any) -> int | None:
        if isinstance(flow, int) and not isinstance(flow, bool) and flow >= 0:
            new = flow * self.num_ranks + self.index
            return new if new < FLOW_ID_BASE else None
        return None


def _names(rank: _Rank) -> list[dict[str, Any]]:
    """Process and thread naming events of one rank."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank.rank, "tid": 0,
         "args": {"name": f"rank {rank.rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank.rank, "tid": 0,
         "args": {"sort_index": rank.rank}},
    ]  # fmt: skip
    for (pid, tid), new in rank.threads.items():
        process = rank.process_names.get(pid, f"pid {pid}")
        thread = rank.thread_names.get((pid, tid), f"tid {tid}")
        out.append({"ph": "M", "name": "thread_name", "pid": rank.rank, "tid": new,
                    "args": {"name": f"{process}: {thread}"}})  # fmt: skip
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank.rank, "tid": new,
                    "args": {"sort_index": new}})  # fmt: skip
    return out


def _ns(us: Any) -> int | None:
    """``rint(us * 1000)`` in float64, exactly as the parser converts (event_times.to_ns)."""
    if not isinstance(us, int | float) or not math.isfinite(us):
        return None
    return round(float(us) * 1000.0)


def _write_rank(
    fh: IO[str],
    path: str,
    rank: _Rank,
    keys: Mapping[tuple[int, int], int],
    anchors: dict[int, list[tuple[int, int, float]]],
    first: list[bool],
) -> None:
    """Copy one rank's events, moved and renamed; note where each matched collective lies."""

    def emit(event: dict[str, Any]) -> None:
        fh.write(("" if first[0] else ",\n") + json.dumps(event, separators=(",", ":")))
        first[0] = False

    def each(e: Any) -> None:
        if not isinstance(e, dict):
            return
        ph = e.get("ph")
        if ph == "M":
            name, args = e.get("name"), e.get("args") or {}
            if name == "process_name":
                rank.process_names[str(e.get("pid"))] = str(args.get("name", ""))
            elif name == "thread_name":
                key = (str(e.get("pid")), str(e.get("tid")))
                rank.thread_names[key] = str(args.get("name", "")).strip()
            return
        if ph not in KEPT_PH or not isinstance(e.get("ts"), int | float):
            return
        out = dict(e)
        out["pid"], out["tid"] = rank.rank, rank.tid(e.get("pid"), e.get("tid"))
        out["ts"] = rank.ts(e["ts"])
        if ph in ("s", "t", "f"):
            new = rank.flow_id(e.get("id"))
            if new is None:
                return
            out["id"] = new
        if ph == "X" and keys:
            start, dur = _ns(e["ts"]), _ns(e.get("dur"))
            if start is not None and dur is not None:
                code = keys.get((start, start + dur))
                if code is not None:
                    middle = out["ts"] + dur / 2000.0
                    anchors.setdefault(code, []).append((rank.rank, out["tid"], middle))
        emit(out)

    stream_trace(path, each)
    for event in _names(rank):
        emit(event)


def _flows(
    anchors: dict[int, list[tuple[int, int, float]]], names: Mapping[int, str]
) -> Iterable[dict[str, Any]]:
    """One flow per matched collective, from its earliest rank to its last, through the rest."""
    for key, points in sorted(anchors.items()):
        if len(points) < 2:
            continue
        points = sorted(points, key=lambda p: (p[2], p[0]))
        for i, (pid, tid, ts) in enumerate(points):
            ph = "s" if i == 0 else ("f" if i == len(points) - 1 else "t")
            event = {"ph": ph, "cat": FLOW_CAT, "name": names.get(key, "collective"),
                     "id": FLOW_ID_BASE + key, "pid": pid, "tid": tid, "ts": ts}  # fmt: skip
            if ph != "s":
                event["bp"] = "e"
            yield event


def write_perfetto(
    files: Mapping[int, str],
    collectives: pd.DataFrame,
    matched: pd.DataFrame | None,
    offsets: pd.DataFrame | None,
    out: Path,
) -> dict[str, Any]:
    """Write the merged trace of ``files`` to ``out`` (see the module docstring).

    Args:
        files: Each rank's trace file.
        collectives: Every rank's collectives (rank, start_ns, end_ns on the rank's own clock).
        matched: The cross-rank per-(collective, rank) table (KEY columns, rank, start_ns and
            end_ns on the reference clock), None where nothing matched.
        offsets: The clock offsets (rank, offset_ns), None where nothing matched.
        out: The JSON file to write (a temporary name, then renamed).

    Returns:
        A summary: ranks, the ranks left on their own clock, collectives linked by flows.
    """
    offset = (
        {} if offsets is None else dict(zip(offsets["rank"], offsets["offset_ns"], strict=True))
    )
    keys_by_rank: dict[int, dict[tuple[int, int], int]] = {r: {} for r in files}
    names: dict[int, str] = {}
    if matched is not None and not matched.empty:
        key_cols = ["group", "step_key", "index"]
        codes = matched.groupby(key_cols, sort=True).ngroup().to_numpy()
        own = matched["rank"].map(offset).fillna(0).astype("int64")
        for rank, s, e, code, name in zip(
            matched["rank"], matched["start_ns"] + own, matched["end_ns"] + own, codes,
            matched["name"], strict=True,
        ):  # fmt: skip
            keys_by_rank.setdefault(int(rank), {})[(int(s), int(e))] = int(code)
            names.setdefault(int(code), str(name))
    anchors: dict[int, list[tuple[int, int, float]]] = {}
    tmp = out.with_name(f".{out.name}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    first = [True]
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            for index, (rank, path) in enumerate(sorted(files.items())):
                state = _Rank(rank, int(offset.get(rank, 0)), len(files), index)
                _write_rank(fh, path, state, keys_by_rank.get(rank, {}), anchors, first)
            num_linked = 0
            for event in _flows(anchors, names):
                num_linked += event["ph"] == "s"
                fh.write(("" if first[0] else ",\n") + json.dumps(event, separators=(",", ":")))
                first[0] = False
            fh.write("\n]}\n")
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written trace is left behind
        raise
    return {
        "path": str(out),
        "num_ranks": len(files),
        "own_clock_ranks": sorted(r for r in files if r not in offset),
        "num_linked_collectives": num_linked,
        "num_collectives": len(collectives),
    }
