"""Kernels that may be communication but that no rule claims: listed, never silently compute.

A GPU kernel that no communication rule claims (:mod:`commprof.traces.comm_rules`) counts as
compute. Where it looks like communication it is listed with its time, why it looks so, and the
entry to add to a rule file: its name holds a communication word (dispatch, combine, all-to-all,
send, recv, notify, barrier, ...), or its launch lies (on its thread) inside a host op of a
communication library (``record_param_comms``, ``c10d::``, ``nccl:``, a ``record_function``
range named after DeepEP, pplx, NVSHMEM, ...) or inside a Python function of one
(``python_function`` events of ``with_stack=True`` traces: ``deep_ep/buffer.py(412): dispatch``,
vLLM's and SGLang's communicators, ``torch.distributed``'s collectives, ...;
``trace_rules.PYTHON_COMM_PATTERN``), the innermost such function named. A kernel of a compute
library (its namespace outside its template arguments) is never listed. Listing counts
nothing: the step figures stay those of the rules, and the list says what they may be missing.

Host ranges are listed apart (:func:`possible_ranges`): a ``user_annotation`` range named like
communication (``trace_rules.HOST_RANGE_PATTERN``) that no rule counts and that no counted
communication kernel accounts for, with its host (CPU) time, never added to kernel time.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.intervals import IntervalSet
from commprof.traces.trace_columns import code_mask
from commprof.traces.trace_rules import (
    CLASSES,
    DEVICE_CATS,
    HOST_COMM_PATTERN,
    HOST_RANGE_PATTERN,
    PYTHON_COMM_PATTERN,
    PYTHON_FUNCTION_CAT,
    RANGE_LIBRARY_PATTERN,
    collective_type,
)

if TYPE_CHECKING:
    from commprof.traces.comm_rules import CommRules
    from commprof.traces.trace_columns import TraceColumns

COMM_WORDS = re.compile(
    r"(?<![a-z])(?:[aA]ll_?(?:[rR]educe|[gG]ather|[tT]o_?[aA]ll|2_?[aA]ll)|[rR]educe_?[sS]catter"
    r"|[sS]end|[rR]ecv|[bB]roadcast|[bB]arrier|[nN]otify|nvshmem|multimem)"
)
"""Words in a kernel name that suggest communication, each at the start of a word (after a
separator, a digit or an upper-case letter)."""
EP_WORDS = re.compile(r"(?<![a-z])(?:[dD]ispatch|[cC]ombine)(?![a-z])")
"""Expert-parallel words (a whole word: not ``combined``), which compute kernels use too: they
suggest communication only in a name without a COMPUTE_WORDS word."""
COMPUTE_WORDS = re.compile(
    r"(?i)norm|gemm|matmul|attn|attention|softmax|conv|elementwise|topk|sort|embedding|rotary"
    r"|rope|silu|gelu|swiglu|quant|cast|routing|gate|scores"
)
"""Words of compute kernels (``groupnorm_kernel_dispatch_up``, a MoE router's scores)."""
COMPUTE_NAMESPACES = re.compile(
    r"at::native|at::cuda|\bc10::|cutlass|cublas|cudnn|\bsm\d+_xmma|\btriton_|\bthrust::|\bcub::"
    r"|flash_?attn|\bfmha|\bgemm|\bgemv|\bfbgemm_gpu::|\bvllm::moe::|\bsgl_kernel::|\btensorrt_llm::kernels::"
    r"(?!\w*all_?reduce|\w*all_?to_?all|\w*userbuffers)"
)
"""Namespaces and prefixes of compute libraries (PyTorch's ATen, CUTLASS, cuBLAS, cuDNN,
Triton, FlashAttention, GEMMs, MoE routing helpers): their kernels are compute whatever
their names say. Searched in a kernel's name without its template arguments and parameters
(:func:`outer_name`): ``c10::BFloat16`` there is a type, not the kernel's library."""
COLUMNS = ("name", "num_events", "time_ns", "why", "rule_line")
RANGE_COLUMNS = ("name", "num_ranges", "host_ns")
"""Columns of :func:`possible_ranges`: a range name, its ranges, their summed host time."""


_PARENS, _ANGLES = re.compile(r"\([^()]*\)"), re.compile(r"<[^<>]*>")
"""What :func:`outer_name` removes, innermost first: a parenthesised and an angle-bracketed
part."""


def outer_name(kernel_name: str) -> str:
    """A kernel's name without what its parentheses and angle brackets hold (parameters,
    template arguments): ``void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16,
    16>(c10::BFloat16*)`` -> ``void anonymous_namespace::multimem_all_reduce_kernel``."""
    text = kernel_name.replace("(anonymous namespace)", "anonymous_namespace")
    for pattern in (_PARENS, _ANGLES):
        while True:
            shorter = pattern.sub("", text)
            if shorter == text:
                break
            text = shorter
    return text


def looks_like_comm(kernel_name: str) -> bool:
    """Whether a kernel's name reads like communication (COMM_WORDS, or EP_WORDS without
    COMPUTE_WORDS)."""
    if COMM_WORDS.search(kernel_name):
        return True
    return EP_WORDS.search(kernel_name) is not None and not COMPUTE_WORDS.search(kernel_name)


def rule_line(kernel_name: str) -> str:
    """The rule-file entry (one YAML line) that would claim ``kernel_name``: its qualified name
    without return type, template and arguments, escaped, typed by name."""
    base = re.sub(r"^(?:void|static|__global__)\s+", "", kernel_name.strip())
    base = re.split(r"[<(\s]", base, maxsplit=1)[0] or kernel_name[:60]
    parts = [p for p in base.split("::") if p]
    library = parts[0] if len(parts) > 1 else "unknown"
    ident = re.sub(r"[^A-Za-z0-9]+", "-", parts[-1] if parts else base).strip("-").lower()
    pattern = re.escape(base) + r"\b"
    pattern = pattern.replace("'", "''")
    return (
        f"- {{name: my-{ident or 'kernel'}, library: {library}, pattern: '{pattern}', "
        "kind: collective, type_from: name, source: <repository path @ commit>}"
    )


def _enclosed(
    at_ns: npt.NDArray[np.int64],
    thread: npt.NDArray[np.int64],
    op_start: npt.NDArray[np.int64],
    op_end: npt.NDArray[np.int64],
    op_thread: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Whether each time lies inside one of the ops of its own thread."""
    out = np.zeros(at_ns.size, bool)
    for t in np.unique(op_thread):
        spans = IntervalSet.from_arrays(op_start[op_thread == t], op_end[op_thread == t])
        sel = np.flatnonzero(thread == t)
        if not sel.size or not len(spans):
            continue
        pos = np.searchsorted(spans.starts, at_ns[sel], side="right") - 1
        inside = (pos >= 0) & (at_ns[sel] < spans.ends[np.maximum(pos, 0)])
        out[sel] = inside
    return out


def _innermost(
    at_ns: npt.NDArray[np.int64],
    thread: npt.NDArray[np.int64],
    op_start: npt.NDArray[np.int64],
    op_end: npt.NDArray[np.int64],
    op_thread: npt.NDArray[np.int64],
) -> npt.NDArray[np.intp]:
    """Index (in the op arrays) of the innermost op of its own thread that each time lies
    inside, -1 where none: of the ops holding it, the one that starts last (Python frames nest)."""
    out = np.full(at_ns.size, -1, np.intp)
    for t in np.unique(op_thread):
        sel = np.flatnonzero(thread == t)
        if not sel.size:
            continue
        idx = np.flatnonzero(op_thread == t)
        order = idx[np.lexsort((-op_end[idx], op_start[idx]))]  # by start, the outer first
        starts, ends = op_start[order], op_end[order]
        parent = np.full(order.size, -1, np.intp)  # the nearest earlier op still open
        stack: list[int] = []
        for i, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            while stack and ends[stack[-1]] <= start:
                stack.pop()
            parent[i] = stack[-1] if stack else -1
            if end > start:
                stack.append(i)
        at = at_ns[sel]
        pos = np.searchsorted(starts, at, side="right") - 1
        closed = (pos >= 0) & (ends[np.maximum(pos, 0)] <= at)
        while closed.any():  # the op that starts last before the time ended: its parent
            pos[closed] = parent[pos[closed]]
            closed = (pos >= 0) & (ends[np.maximum(pos, 0)] <= at)
        out[sel[pos >= 0]] = order[pos[pos >= 0]]
    return out


def possible_comm(
    cols: TraceColumns,
    targets: npt.NDArray[np.int8],
    comm: CommRules,
    launch: npt.NDArray[np.intp],
) -> pd.DataFrame:
    """The kernels counted as compute that may be communication (see the module docstring).

    Args:
        cols: The trace's columns.
        targets: Each event's class index in CLASSES (-1: none).
        comm: The communication rules used.
        launch: Each event's index in the launch columns (-1: none), as
            ``event_classes.Events.launch_of`` gives it for every event.

    Returns:
        One row per kernel name (COLUMNS), most time first: its events, their summed time, why
        it is listed, and the rule-file line that would count it.
    """
    compute = CLASSES.index("compute")
    is_kernel = code_mask(cols.cat_code, [c == "kernel" for c in cols.cats])
    names = [str(n) for n in cols.names]
    unclaimed = [
        comm.claim(n) is None and not COMPUTE_NAMESPACES.search(outer_name(n)) for n in names
    ]
    cand = np.flatnonzero(is_kernel & (targets == compute) & code_mask(cols.name_code, unclaimed))
    if not cand.size:
        return pd.DataFrame(columns=list(COLUMNS))
    by_name = np.array([looks_like_comm(n) for n in names], bool)
    named = by_name[cols.name_code[cand]]
    host_rx, python_rx = re.compile(HOST_COMM_PATTERN), re.compile(PYTHON_COMM_PATTERN)
    host_code = [host_rx.match(n) is not None for n in names]
    python = code_mask(cols.cat_code, [c == PYTHON_FUNCTION_CAT for c in cols.cats])
    ops = np.flatnonzero(code_mask(cols.name_code, host_code) & ~_device(cols) & ~python)
    python_code = [python_rx.match(n) is not None for n in names]
    frames = np.flatnonzero(python & code_mask(cols.name_code, python_code))
    inside = np.zeros(cand.size, bool)
    in_frame = np.full(cand.size, -1, np.int64)  # the name code of the innermost frame
    has = launch[cand] >= 0
    if has.any():
        pos = launch[cand][has]
        at, thread = cols.launch_start_ns[pos], cols.launch_thread[pos]
        if ops.size:
            inside[has] = _enclosed(
                at, thread, cols.start_ns[ops], cols.end_ns[ops], cols.thread[ops]
            )
        if frames.size:
            of = _innermost(
                at, thread, cols.start_ns[frames], cols.end_ns[frames], cols.thread[frames]
            )
            in_frame[has] = np.where(of >= 0, cols.name_code[frames[of]], -1)
    listed = named | inside | (in_frame >= 0)
    if not listed.any():
        return pd.DataFrame(columns=list(COLUMNS))
    idx, named, inside, in_frame = cand[listed], named[listed], inside[listed], in_frame[listed]
    frame = pd.DataFrame({
        "code": cols.name_code[idx], "time_ns": cols.end_ns[idx] - cols.start_ns[idx],
        "named": named, "inside": inside, "in_frame": in_frame,
    })  # fmt: skip
    rows = []
    for code, group in frame.groupby("code", sort=False):
        name = names[int(code)]  # type: ignore[arg-type]  # an int32 group key
        why = []
        if group["named"].any():
            why.append("its name reads like communication")
        if group["inside"].any():
            why.append(f"{int(group['inside'].sum())} launched inside a communication op")
        if (group["in_frame"] >= 0).any():
            why.append(_frames_why(group["in_frame"], names))
        rows.append({
            "name": name, "num_events": len(group), "time_ns": int(group["time_ns"].sum()),
            "why": "; ".join(why), "rule_line": rule_line(name),
        })  # fmt: skip
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    return out.sort_values("time_ns", ascending=False, kind="stable").reset_index(drop=True)


def _frames_why(in_frame: pd.Series, names: list[str]) -> str:
    """Why a kernel launched inside Python functions of communication libraries is listed:
    how many, inside which function (the most frequent), and how many other functions."""
    counts = in_frame[in_frame >= 0].value_counts(sort=True)
    top = names[int(counts.index[0])]
    others = len(counts) - 1
    more = f" (and {others} other function{'s' if others > 1 else ''})" if others else ""
    return f"{int(counts.sum())} launched inside {top}{more}"


def _device(cols: TraceColumns) -> npt.NDArray[np.bool_]:
    return code_mask(cols.cat_code, [c in DEVICE_CATS for c in cols.cats])


def possible_ranges(
    cols: TraceColumns,
    targets: npt.NDArray[np.int8],
    launch: npt.NDArray[np.intp],
    counted_types: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """The host ranges that may be communication and that nothing counted accounts for.

    A ``user_annotation`` event whose name HOST_RANGE_PATTERN matches (the names are matched
    once each, not per event), that no rule counts, and that no counted communication kernel
    accounts for: none was launched inside it (on its thread) and none ran while it was open
    (a wait on a collective launched earlier, the preparation of one that runs meanwhile).
    A range that names a collective type but no library outside PyTorch's process groups
    (TorchRec's ``## all2all_data:recat_values ##`` around its all-to-alls, ``nccl:all_to_all``
    of a grouped call whose kernel the group's last op launched) is accounted for where the
    trace counts collectives of that type: its communication is counted, wherever it was
    launched. A range that names such a library (RANGE_LIBRARY_PATTERN: DeepEP, NVSHMEM, pplx,
    ...) is not: only a kernel launched in or running during it accounts for it.

    Args:
        cols: The trace's columns.
        targets: Each event's class index in CLASSES (-1: none).
        launch: Each event's index in the launch columns (-1: none), as for
            :func:`possible_comm`.
        counted_types: The collective types of the trace's counted collectives.

    Returns:
        One row per range name (RANGE_COLUMNS), most host time first: its ranges and their
        summed host time (ns; CPU time, apart from any kernel time).
    """
    comm = CLASSES.index("communication")
    rx = re.compile(HOST_RANGE_PATTERN)
    library = re.compile(RANGE_LIBRARY_PATTERN)
    ranged = [
        rx.match(n) is not None
        and (library.search(n) is not None or collective_type(n) not in counted_types)
        for n in map(str, cols.names)
    ]
    is_range = code_mask(cols.cat_code, [c == "user_annotation" for c in cols.cats])
    cand = np.flatnonzero(is_range & code_mask(cols.name_code, ranged) & (targets != comm))
    if not cand.size:
        return pd.DataFrame(columns=list(RANGE_COLUMNS))
    counted = np.flatnonzero(_device(cols) & (targets == comm))
    start, end = cols.start_ns[cand], cols.end_ns[cand]
    covered = np.zeros(cand.size, bool)
    pos = launch[counted]
    if (pos >= 0).any():
        at, thread = cols.launch_start_ns[pos[pos >= 0]], cols.launch_thread[pos[pos >= 0]]
        for t in np.unique(cols.thread[cand]):
            sel = np.flatnonzero(cols.thread[cand] == t)
            times = np.sort(at[thread == t])
            lo = np.searchsorted(times, start[sel], side="left")
            covered[sel] = np.searchsorted(times, end[sel], side="right") > lo
    spans = IntervalSet.from_arrays(cols.start_ns[counted], cols.end_ns[counted])
    if len(spans):  # merged and sorted: the last span opening before a range's end ends last
        last = np.searchsorted(spans.starts, end, side="left") - 1
        covered |= (last >= 0) & (spans.ends[np.maximum(last, 0)] > start)
    idx = cand[~covered]
    if not idx.size:
        return pd.DataFrame(columns=list(RANGE_COLUMNS))
    frame = pd.DataFrame(
        {"code": cols.name_code[idx], "host_ns": cols.end_ns[idx] - cols.start_ns[idx]}
    )
    out = frame.groupby("code", sort=False)["host_ns"].agg(["size", "sum"]).reset_index()
    names = [str(cols.names[int(c)]) for c in out["code"]]
    rows = pd.DataFrame({
        "name": names, "num_ranges": out["size"].astype(np.int64),
        "host_ns": out["sum"].astype(np.int64),
    })  # fmt: skip
    return rows.sort_values("host_ns", ascending=False, kind="stable").reset_index(drop=True)
