"""What the timing hook costs a step, measured in the cell that carries it: hooked against plain
DDP, step by step, in the same gang.

After a cell's measured steps (and after the profiler has stopped), :func:`plain_replica` builds
a second DDP model of the same architecture and weights in the same process group, without the
timing hook: DDP's built-in all-reduce where the cell's hook is ``allreduce`` (what a user's
training runs without commprof), the named inner hook registered directly otherwise.
:func:`interleaved_pairs` then runs ``pairs`` pairs of steps, one step of each model per pair
on the same batch, in an order drawn per pair from a seeded generator (the same on every rank,
so every rank steps the same model at the same time; a fixed alternation would always give one
arm the first place after the barrier). Each step starts after an untimed barrier, so both
ranks start it together, and is timed as the measured steps are (``trainer._timed_step``).
``WARMUP_PAIRS`` pairs run first and are not recorded: the replica's step 0 holds one bucket
until DDP rebuilds them, and both arms warm their allocators.

The measured steps are not touched: the pairs run after them, and the replica exists only for
the pairs. Rows (``hook_cost`` table, one per rank, pair and arm): ``pair, arm, position`` (0:
stepped first in its pair), ``step_ns`` and ``backward_ns``. The analysis
(``commprof.analysis.hook_cost``) takes per pair the slowest rank's step of each arm and the
median of the paired differences, with an order-statistics interval.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from commprof.profiling.comm_hooks import INNER_HOOKS

ARMS = ("hooked", "plain")
"""The two models of a pair: with commprof's timing hook, and without it."""
WARMUP_PAIRS = 2
"""Pairs run first and not recorded: the replica's step 0 (one bucket, then DDP's rebuild)
and a second to warm both arms alike."""

StepFn = Callable[[str, int], tuple[int, int, int, int]]
"""``step(arm, index) -> (t0, t1, t2, t3)``: one training step of an arm on batch ``index``,
host clock at its start and after forward, backward and the optimizer."""


def plain_replica(
    ddp: DistributedDataParallel, model: torch.nn.Module, *, hook: str, bucket_cap_mb: float | None
) -> DistributedDataParallel:
    """A DDP model like ``ddp`` (same architecture, the same weights now) without the timing hook.

    Args:
        ddp: the hooked model of the cell.
        model: a fresh instance of the same architecture, on the same device (its weights are
            overwritten with ``ddp``'s).
        hook: the cell's inner hook: ``allreduce`` leaves DDP's built-in all-reduce (no hook
            registered), any other name of ``INNER_HOOKS`` is registered as it is.
        bucket_cap_mb: the cell's cap (None: DDP's default).

    Returns:
        The plain replica, in the same process group (its construction broadcasts parameters:
        every rank must call this at the same point).
    """
    if hook not in INNER_HOOKS:
        raise ValueError(f"hook {hook!r} is not one of: {', '.join(INNER_HOOKS)}")
    model.load_state_dict(ddp.module.state_dict())
    device = next(model.parameters()).device
    plain = DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        process_group=ddp.process_group,
    )
    if hook != "allreduce":
        plain.register_comm_hook(None, INNER_HOOKS[hook])
    return plain


def interleaved_pairs(
    step: StepFn, *, pairs: int, seed: int, rank: int, barrier: Callable[[], Any]
) -> list[dict[str, Any]]:
    """Run ``WARMUP_PAIRS`` then ``pairs`` pairs of one hooked and one plain step.

    Args:
        step: runs one step of an arm on batch ``index`` (``WARMUP_PAIRS + pair``, counted from
            0 at the first warm-up pair) and returns its four clock readings.
        pairs: recorded pairs (>= 1).
        seed: seeds the order of each pair; the same on every rank.
        rank: this process's rank, for the rows.
        barrier: an untimed barrier of the process group, called before every step.

    Returns:
        Rows ``rank, pair, arm, position, step_ns, backward_ns`` of the recorded pairs.
    """
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs!r}")
    order = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for index in range(WARMUP_PAIRS + pairs):
        arms = list(ARMS)
        order.shuffle(arms)
        for position, arm in enumerate(arms):
            barrier()  # sync point: both ranks start the step together (untimed)
            t0, t1, t2, t3 = step(arm, index)
            if index >= WARMUP_PAIRS:
                rows.append(
                    {
                        "rank": rank,
                        "pair": index - WARMUP_PAIRS,
                        "arm": arm,
                        "position": position,
                        "step_ns": t3 - t0,
                        "backward_ns": t2 - t1,
                    }
                )
    return rows
