"""What an nccl-tests log's table says about its collective, and the checks a caller makes.

A run whose header does not name its test (``# Collective test starting: X_perf``, or its
``concluded`` line) is named by its table where the table allows only one collective: busbw /
algbw at the run's world size, and the ``root`` and ``redop`` columns (:func:`table_collectives`,
called by the reader, :mod:`commprof.modeling.collective.nccl_log`). A log is checked against the
collective asked for (:func:`check_collective`) and its world size against the one given
(:func:`log_world_size`); what its runs skipped is said aloud (:func:`skipped_summary`), and so
is a log whose rank lines list other hosts than the whole nodes a description places its ranks on
(:func:`placement_summary`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from commprof.modeling.collective.nccl_log_runs import NcclTestsLog, Run

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


def named_by_table(run: Run, columns: Sequence[str], roots: set[str]) -> Run:
    """``run`` with what its table fits (:func:`table_collectives`), and the collective its
    table gives where the header names none and the table fits only one."""
    candidates, evidence = table_collectives(run, columns, roots)
    inferred = run.collective is None and len(candidates) == 1
    return replace(
        run,
        collective=candidates[0] if inferred else run.collective,
        candidates=candidates,
        evidence=evidence,
        inferred=inferred,
    )


def runs_as(run: Run, collective: str) -> bool:
    """Whether ``run`` may be a run of ``collective``: the one its header names or its table
    gives, or (where neither names one) one its table fits or cannot rule out."""
    named = run.collective is not None and not run.inferred
    return collective == run.collective or (
        not named and (not run.candidates or collective in run.candidates)
    )


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
        if runs_as(r, collective):
            continue
        fits = (r.collective,) if r.collective is not None else r.candidates
        what = f"is a log of {r.collective}" if r.collective else f"fits {' or '.join(fits)}"
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
    """The log's world size: its rank lines, else ``given``, else the one that every run's
    busbw / algbw implies (:func:`implied_world_size`; the runs' evidence says it aloud)."""
    if log.world_size is None:
        if given is not None:
            return given
        implied = {implied_world_size(r) for r in log.runs}
        if len(implied) == 1 and None not in implied:
            return implied.pop()  # type: ignore[return-value]
        raise ValueError(
            f"{log.source}: lists no '#  Rank' lines, and its busbw / algbw implies no one world "
            "size (a ratio of 1, or rows too slow for the printed rounding), so its world size "
            "is unknown; keep the header of the log (its '#  Rank' lines)"
        )
    if given is not None and given != log.world_size:
        raise ValueError(f"{log.source}: has {log.world_size} ranks, not {given}")
    return log.world_size


def skipped_summary(log: NcclTestsLog) -> str | None:
    """What a log's runs did not keep, a collective inferred from the table rather than named,
    and a table that contradicts the collective its header names, said aloud (``None`` where
    none of these): ``file: run 1 skipped 3 rows (0 bytes: lines 10-12); ...``."""
    parts = []
    for r in log.runs:
        said = f"{r.collective} inferred from the table ({r.evidence})" if r.inferred else ""
        if r.collective is not None and r.candidates and r.collective not in r.candidates:
            said = (
                f"its header names {r.collective}, but its table fits "
                f"{' or '.join(r.candidates)} ({r.evidence}): is that the world size it ran at?"
            )
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
    if log.set_aside:
        runs = ", ".join(f"{r.index} ({r.collective or 'not named'})" for r in log.set_aside)
        parts.append(f"run(s) {runs} set aside: another collective")
    return f"{log.source}: " + "; ".join(parts) if parts else None


def placement_summary(log: NcclTestsLog, gpus_per_node: int) -> str | None:
    """A log whose rank lines list another number of hosts than the whole nodes of
    ``gpus_per_node`` GPUs its ranks fill, said aloud (``None`` where they agree, or where the
    log lists no hosts): one GPU a node, or part of each, is fitted as whole nodes would be, which
    is wrong where the hosts are nodes (a container a GPU lists more hosts than nodes)."""
    ranks, hosts = log.world_size, log.num_hosts
    if ranks is None or hosts is None:
        return None
    nodes = -(-ranks // gpus_per_node)
    if hosts == nodes:
        return None
    return (
        f"{log.source}: its {ranks} ranks are on {hosts} hosts (its rank lines), but whole nodes "
        f"of {gpus_per_node} GPUs hold them on {nodes}, as the fit takes them: if its hosts are "
        "nodes, give a description of their GPUs a node"
    )
