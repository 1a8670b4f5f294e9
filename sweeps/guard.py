"""The memory guard and a duration estimate, applied to the cells of a matrix.

Adapts :class:`commprof.matrix.Cell` to :mod:`commprof.modeling.memory` with the budgets
of this machine, overridden by the matrix file's ``budget`` section.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from functools import cache
from typing import Any

from commprof.matrix import CELL_FIELDS, Cell, Matrix
from commprof.modeling import memory

log = logging.getLogger(__name__)

# Duration estimate of a cell, for `commprof check` and the progress bar before the first cell
# finishes. Rough by design (a planning aid, not a measurement): constants measured on a 2-core
# machine with torch 2.13 CPU, gloo over loopback.
DRIVER_START_S = 12.0
"""The driver's imports and an embedded Ray's start, before the first cell."""
GANG_START_S = 2.5
"""New rank processes and `import torch` (2.4 s for 2 ranks; docs/design.md, Measured facts)."""
CELL_SETUP_S = 2.0
"""Process group, model build, DDP wrap, the interference probes and the commit of a cell on a
reused gang."""
PROFILE_S = 2.5
"""A profiled cell's extra: the profiler started and stopped, its traces written and analysed."""
STEP_OVERHEAD_S = 0.002
"""A CPU step's fixed part beside its FLOPs and bytes: Python, the hooks, gloo's latency."""
CPU_FLOPS_PER_S = 2e10
"""Effective fp32 training throughput of one CPU rank (one thread)."""
GPU_FLOPS_PER_S = 2e14
"""Effective fp32/TF32 training throughput of one GPU."""
LOOPBACK_BYTES_PER_S = 1e9
"""Effective gloo ring bandwidth over loopback."""
MICROBENCH_WARMUP_ITERS = 5
"""Untimed all-reduces the trainer runs per microbenchmark size and pass (the library default,
``commprof.training.microbench.DEFAULT_WARMUP_ITERS``; a test keeps the two equal)."""
MICROBENCH_ITER_S = 0.01
"""A rough all-reduce time per microbenchmark iteration, averaged over the sizes."""
HOOK_COST_WARMUP_PAIRS = 2
"""Unrecorded pairs before a cell's hook-cost pairs (``commprof.training.hook_cost.WARMUP_PAIRS``;
a test keeps the two equal)."""
TRAIN_FLOPS_PER_PARAM_SAMPLE = 6
"""Forward + backward FLOPs per parameter per sample (Kaplan et al. 2020, C = 6 N D)."""


_SHARED_FIELDS = tuple(
    f.name for f in dataclasses.fields(memory.CellShape) if f.name in CELL_FIELDS
)
"""What the guard's :class:`~commprof.modeling.memory.CellShape` takes from a cell as is."""


class GuardPlan:
    """Guard decisions for the cells of one matrix, cached by cell id.

    Args:
        matrix: the matrix (its ``budget`` section overrides detected budgets); None for one
            cell run outside a matrix (``commprof run``).
        num_nodes: nodes the cluster has (SPREAD cells put ceil(world size / nodes) on each).
        node_budgets: budgets of the nodes that hold ranks, by device kind (``cpu``, ``cuda``),
            as probed on the cluster; default: ``local``.
        local: this machine's budgets; default: its host memory without GPUs
            (``commprof.training.devices.detect_budgets`` adds the GPUs, with torch).
    """

    def __init__(
        self,
        matrix: Matrix | None = None,
        *,
        num_nodes: int = 1,
        node_budgets: dict[str, memory.Budgets] | None = None,
        local: memory.Budgets | None = None,
    ) -> None:
        local = local or memory.detect_budgets()
        overrides = matrix.budget_bytes if matrix is not None else {}
        self.budgets_by_device = {
            device: (node_budgets or {}).get(device, local).with_overrides(overrides)
            for device in ("cpu", "cuda")
        }
        self.num_nodes = num_nodes
        self._decisions: dict[str, memory.GuardDecision] = {}

    def ranks_per_node(self, cell: Cell) -> int:
        """Ranks of the cell on its busiest node: PACK puts them together where they fit."""
        if cell.placement in ("SPREAD", "STRICT_SPREAD"):
            return math.ceil(cell.world_size / self.num_nodes)
        return cell.world_size

    def decide(self, cell: Cell) -> memory.GuardDecision:
        """The guard's decision for ``cell``, with its arithmetic."""
        decision = self._decisions.get(cell.cell_id)
        if decision is None:
            shape = memory.CellShape(
                **{name: getattr(cell, name) for name in _SHARED_FIELDS},
                ranks_per_node=self.ranks_per_node(cell),
                num_steps=cell.steps,
                microbench_max_bytes=max(
                    cell.microbench_sizes_bytes or (memory.DEFAULT_MICROBENCH_MAX_BYTES,)
                ),
            )
            budgets = self.budgets_by_device[cell.device]
            decision = memory.evaluate(shape, budgets, _footprint(cell.model))
            self._decisions[cell.cell_id] = decision
        return decision

    @staticmethod
    def num_params(cell: Cell) -> int:
        """The cell's model's parameter count (closed form)."""
        return _footprint(cell.model).num_parameters


PROBE_TIMEOUT_S = 60.0
"""How long a budget probe task on a cluster node may take."""


def probe_budgets(workers: list[dict[str, Any]]) -> dict[str, memory.Budgets]:
    """Budgets of the nodes that will hold ranks, measured there by a small Ray task.

    On one node (the embedded Ray, a laptop) that is this machine, detected locally. On a
    cluster the driver may sit on a CPU-only head whose memory says nothing about the workers':
    a task with ``num_cpus=1`` (and one with ``num_gpus=1`` where the cluster has GPUs) runs
    ``commprof.actors.probe.node_budgets`` on a worker and reports back (one node Ray picks: on
    a cluster of mixed machines set the smallest node's budgets in the matrix file). If the
    probe cannot run in time, this machine's budgets are used, with a warning.

    Args:
        workers: ``ray.nodes()`` entries of the alive nodes that can hold a rank.

    Returns:
        Budgets by device kind; a kind the cluster cannot host is left out.
    """
    import ray

    from commprof.actors.probe import node_budgets

    here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    has_gpu = any(n.get("Resources", {}).get("GPU", 0) > 0 for n in workers)
    if not workers or (len(workers) == 1 and workers[0].get("NodeID") == here and not has_gpu):
        return {}  # this machine is the node: local detection (GuardPlan's default) is right
    probe = ray.remote(node_budgets)
    refs = {"cpu": probe.options(num_cpus=1).remote(False)}
    if has_gpu:
        refs["cuda"] = probe.options(num_cpus=0, num_gpus=1).remote(True)
    try:
        found = ray.get(list(refs.values()), timeout=PROBE_TIMEOUT_S)
    except ray.exceptions.RayError as err:  # GetTimeoutError included
        for ref in refs.values():
            ray.cancel(ref, force=True)
        log.warning(
            "could not measure memory budgets on the cluster's nodes (%s); the memory guard "
            "uses this machine's; set them in the matrix's budget section if they differ",
            type(err).__name__,
        )
        return {}
    return dict(zip(refs, found, strict=True))


@cache
def _footprint(model: str) -> memory.ModelFootprint:
    return memory.model_footprint(model)


def estimate_cell_s(cell: Cell, num_params: int) -> float:
    """A rough duration of one cell attempt in seconds (see the constants above)."""
    flops = TRAIN_FLOPS_PER_PARAM_SAMPLE * num_params * cell.batch_size
    rate = GPU_FLOPS_PER_S if cell.device == "cuda" else CPU_FLOPS_PER_S
    p = cell.world_size
    comm_s = 2 * (p - 1) / p * num_params * 4 / LOOPBACK_BYTES_PER_S if p > 1 else 0.0
    iters = (MICROBENCH_WARMUP_ITERS + cell.microbench_iters) * cell.microbench_passes
    micro_s = len(cell.microbench_sizes_bytes) * iters * MICROBENCH_ITER_S
    pairs = cell.hook_cost_pairs + (HOOK_COST_WARMUP_PAIRS if cell.hook_cost_pairs else 0)
    steps = cell.warmup_steps + cell.steps + 2 * pairs  # a hooked and a plain step per pair
    fixed = STEP_OVERHEAD_S if cell.device == "cpu" else 0.0
    profile_s = PROFILE_S if cell.profile else 0.0
    return CELL_SETUP_S + profile_s + steps * (flops / rate + comm_s + fixed) + micro_s


def contention(load_1m: float, num_cpus: int) -> float:
    """How much slower a sweep runs on this machine now than idle: the square root of the load
    average per core, at least 1.

    Not the load per core itself: the load average counts every runnable thread (Ray's and
    gloo's many, mostly waiting), so a sweep at a load of 3.5 per core runs about twice, not
    3.5 times, slower than idle; the rule is fitted on smoke sweeps on a shared 2-core machine
    at several loads; ``benchmarks/bench_check_estimate.py`` measures how close it comes."""
    return max(1.0, max(0.0, load_1m) / max(1, num_cpus)) ** 0.5


def estimate_sweep_s(
    cells: list[tuple[Cell, int]], *, embedded: bool, load_1m: float, num_cpus: int
) -> float:
    """A sweep's duration, one cell at a time: the driver's start, a gang per shape, the cells.

    Args:
        cells: the feasible cells with their parameter counts.
        embedded: on an embedded Ray of this machine (its start is counted, and the machine's
            load slows every part); False: a cluster's nodes, whose load is not known here.
        load_1m: this machine's 1-minute load average.
        num_cpus: this machine's cores.
    """
    if not cells:
        return 0.0
    shapes = {cell.gang_shape for cell, _ in cells}
    total = GANG_START_S * len(shapes) + sum(estimate_cell_s(c, n) for c, n in cells)
    if not embedded:
        return total
    return contention(load_1m, num_cpus) * (DRIVER_START_S + total)
