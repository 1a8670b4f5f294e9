"""The collectives table of a trace: one row per collective, with its type, group, size and
sequence number, and the step it belongs to.

Collective metadata in the event args (``Collective name``, ``Process Group Name``, ``Seq``)
comes before name patterns, which are only a fallback: a collective's own args first, then its
launching op's (``record_param_comms``, found enclosing the launch on its thread), then the
launching ``nccl:<op>``'s name, then the kernel name, unless the communication rule that claims
the kernel types it (:func:`commprof.traces.comm_rules.CommRules.claim`). A collective's step is
the step whose ``ProfilerStep`` launched it, else the window it starts in.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.collective_args import (
    MergedArgs,
    bytes_column,
    first_codes,
    int_column,
    text_category,
)
from commprof.traces.comm_rules import CommRule, CommRules
from commprof.traces.event_classes import Events
from commprof.traces.intervals import Int64Array
from commprof.traces.kept_args import ABSENT
from commprof.traces.trace_columns import code_mask
from commprof.traces.trace_rules import COMM_OP_PATTERN, DEVICE_CATS, collective_type
from commprof.traces.windows import step_index

COMM_OP = re.compile(COMM_OP_PATTERN)
OP_DEPTH = 4
"""Enclosing ops searched for a collective's launching op, innermost first (record_param_comms >
nccl:all_reduce, under ops of other names: a few deep in real traces)."""


def _launching_ops(
    evs: Events, idx: npt.NDArray[np.intp], launch: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """For each collective: its launching op with metadata and its launching op with a typed
    name (indices of events, -1 for none).

    The launching ops enclose the launch (the runtime call the kernel's correlation id names)
    on its thread: ``record_param_comms`` carries ``Collective name``, group, size and sequence
    number; ``nccl:all_to_all`` names the collective. The innermost enclosing op of each kind
    is taken, up to OP_DEPTH deep.
    """
    with_args = np.full(idx.size, -1, np.intp)
    with_name = np.full(idx.size, -1, np.intp)
    cols = evs.cols
    op_code = [COMM_OP.match(str(n)) is not None for n in cols.names]
    ops = np.flatnonzero(code_mask(cols.name_code, op_code) & ~evs.cat_mask(DEVICE_CATS))
    has = np.flatnonzero(launch >= 0)
    if not ops.size or not has.size:
        return with_args, with_name
    op_has_args = evs.with_arg("Collective name")
    typed_code = np.array(
        [ok and collective_type(n) != "unknown" for ok, n in zip(op_code, cols.names, strict=True)]
    )
    lthread = cols.launch_thread[launch[has]]
    lstart = cols.launch_start_ns[launch[has]]
    for thread in np.unique(lthread):
        o = ops[evs.thread[ops] == thread]
        if not o.size:
            continue
        o = o[np.argsort(evs.start_ns[o], kind="stable")]
        o_start, o_end = evs.start_ns[o], evs.end_ns[o]
        sel = lthread == thread
        at, who = lstart[sel], has[sel]
        pos = np.searchsorted(o_start, at, side="right") - 1
        for depth in range(OP_DEPTH):  # innermost first: fill only what is still missing
            j = np.maximum(pos - depth, 0)
            inside = (pos - depth >= 0) & (o_end[j] >= at)
            cand = o[j]
            take = inside & op_has_args[cand] & (with_args[who] < 0)
            with_args[who[take]] = cand[take]
            take = inside & typed_code[evs.name_code[cand]] & (with_name[who] < 0)
            with_name[who[take]] = cand[take]
    return with_args, with_name


def collectives_table(
    evs: Events,
    idx: npt.NDArray[np.intp],
    windows: tuple[Int64Array, Int64Array, Int64Array],
    cpu: tuple[Int64Array, Int64Array, Int64Array] | None,
    comm: CommRules | None = None,
) -> pd.DataFrame:
    """The collectives table (see ``ParsedTrace.collectives``)."""
    ids, starts, ends = windows
    start, end = evs.start_ns[idx], evs.end_ns[idx]
    launch = evs.launch_of(idx)
    with_args, with_name = _launching_ops(evs, idx, launch)
    lstarts = evs.cols.launch_start_ns
    launch_start = lstarts[np.maximum(launch, 0)] if lstarts.size else start
    by_launch = step_index(cpu, launch_start, launch >= 0)
    win = np.searchsorted(starts, start, side="right") - 1
    inside = (win >= 0) & (start < ends[np.clip(win, 0, None)])
    step = np.where(inside, ids[np.clip(win, 0, None)], 0)
    if cpu is not None:
        step = np.where(by_launch >= 0, cpu[0][np.maximum(by_launch, 0)], step)
    known = inside | (by_launch >= 0)
    merged = MergedArgs(evs.cols.args, idx, with_args)
    event_code = evs.name_code[idx]
    op_code = np.where(with_name >= 0, evs.name_code[np.maximum(with_name, 0)], -1)
    claimed = {evs.names[c] for c in np.unique(event_code).tolist()}
    claims = {n: comm.claim(str(n)) for n in claimed} if comm is not None else {}
    typed = _typed(merged, event_code, op_code.astype(np.int64), evs.names, claims)
    frame = pd.DataFrame({
        "name": typed["name"], "collective_type": typed["collective_type"],
        "start_ns": start, "end_ns": end, "duration_ns": end - start,
        "step": pd.array(step, dtype="Int64"),
        "seq": int_column(_seq(merged)),
        "num_bytes": bytes_column(
            merged.values("In msg nelems"), merged.values("dtype"), merged.row
        ),
        "process_group": text_category(merged.values("Process Group Name", "")),
        "thread": evs.thread[idx],
        "group_size": int_column(merged.values("Group size")),
        "type_source": typed["type_source"],
        "library": typed["library"], "point_to_point": typed["point_to_point"],
    })  # fmt: skip
    frame.loc[~known, "step"] = pd.NA
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _seq(merged: MergedArgs) -> list[Any]:
    """``Seq`` of each row, else its ``seq_num`` (older PyTorch)."""
    seq, gaps = merged.held("Seq")
    if gaps:
        old = merged.values("seq_num")
        for i in gaps:
            seq[i] = old[i]
    return seq


_Typed = tuple[Any, Any, str, str, bool]
"""A collective's name, the name its type is read from, type source, library, point-to-point."""


def _type_one(
    a: dict[str, Any], o: dict[str, Any], event_name: Any, op_name: Any, rule: CommRule | None
) -> _Typed:
    """One collective's name and type source (``ParsedTrace.collectives``): the claiming rule's
    fixed type or kernel name, else ``Collective name`` in its own args, then its launching
    op's, then the launching ``nccl:<op>``'s name, then the kernel name."""
    library = rule.library if rule is not None else ""
    p2p = rule is not None and rule.kind == "point_to_point"
    if rule is not None and rule.type_from == "fixed":
        return event_name, rule.collective_type, "rule", library, p2p
    if rule is not None and rule.type_from == "name":
        return event_name, event_name, "event name", library, p2p
    if "Collective name" in a:
        return a["Collective name"], a["Collective name"], "args", library, p2p
    if "Collective name" in o:
        return o["Collective name"], o["Collective name"], "launching op", library, p2p
    if op_name is not None:
        return event_name, op_name, "op name", library, p2p
    return event_name, event_name, "event name", library, p2p


def _factorized(values: list[Any]) -> npt.NDArray[np.int64]:
    """Codes of hashable values in order of first appearance (TypeError if one is not)."""
    if values and hash(values[0]) is not None and values.count(values[0]) == len(values):
        return np.zeros(len(values), np.int64)  # one value all through (list.count runs in C)
    return first_codes(values, np.int64)[0]


def _combined(columns: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.int64]:
    """One int64 key per row, equal where the rows are equal in every column (the columns'
    codes combined one column at a time, each product below rows squared)."""
    key = np.zeros(columns[0].size, np.int64)
    for col in columns:
        _, code = np.unique(col, return_inverse=True)
        key = key * (int(code.max(initial=0)) + 1) + code.reshape(-1)
        _, key = np.unique(key, return_inverse=True)
        key = key.reshape(-1).astype(np.int64)
    return key


def _from_combos(values: list[Any], inverse: npt.NDArray[np.intp]) -> pd.Categorical:
    """A categorical column whose row i holds ``values[inverse[i]]`` (as strings)."""
    text = [str(v) for v in values]
    distinct = list(dict.fromkeys(text))
    code = {v: i for i, v in enumerate(distinct)}
    codes = np.array([code[t] for t in text], np.int32)[inverse]
    return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))


def _typed(
    merged: MergedArgs,
    event_code: npt.NDArray[np.int32],
    op_code: npt.NDArray[np.int64],
    names: list[Any],
    claims: dict[Any, CommRule | None],
) -> dict[str, Any]:
    """The name, collective_type, type_source, library and point_to_point columns: each
    collective's :func:`_type_one`, computed once per distinct combination of what it reads
    (kernel name, launching op name, the two ``Collective name`` values; a trace of many
    collectives holds few), then spread to the rows with numpy."""
    missing, num = ABSENT, len(merged)
    own_cn = merged.own("Collective name")
    # The op's is read only where some kernel's own args lack it (_type_one: the own first)
    op_cn = merged.op("Collective name") if missing in own_cn else [missing] * num
    try:
        keys = _combined([event_code.astype(np.int64), op_code, _factorized(own_cn),
                          _factorized(op_cn)])  # fmt: skip
    except TypeError:  # an unhashable Collective name (a list): every collective on its own
        keys = np.arange(num, dtype=np.int64)
    if not num:
        combos, inverse = np.empty(0, np.intp), np.empty(0, np.intp)
    else:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # combinations in order of first appearance
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        combos, inverse = first[order], rank[np.asarray(inverse).reshape(-1)]
    inverse = np.asarray(inverse).reshape(-1)
    rows = []
    for i in combos.tolist():
        a = {} if own_cn[i] is missing else {"Collective name": own_cn[i]}
        o = {} if op_cn[i] is missing else {"Collective name": op_cn[i]}
        op_name = names[op_code[i]] if op_code[i] >= 0 else None
        event_name = names[event_code[i]]
        rows.append(_type_one(a, o, event_name, op_name, claims.get(event_name)))
    name, kind, how, library, p2p = (
        (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [], [])
    )
    return {
        "name": _from_combos(name, inverse),
        "collective_type": _from_combos([collective_type(k) for k in kind], inverse),
        "type_source": _from_combos(how, inverse),
        "library": _from_combos(library, inverse),
        "point_to_point": np.array(p2p, bool)[inverse] if rows else np.zeros(0, bool),
    }
