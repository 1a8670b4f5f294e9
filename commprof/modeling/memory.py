"""Memory feasibility guard: cost every memory pool a cell draws on, before it runs.

A cell is feasible when, for every pool, the bytes it needs do not exceed the
budget. A decision keeps its arithmetic (the terms of every pool) so that a
rejected cell's row in the dataset says exactly why it was not run.

Pools (``need`` is the sum of the listed terms; ``b`` = dtype bytes, ``P`` =
parameters, ``r`` = ranks on one node, ``k`` = optimizer state copies):

- ``device`` (CUDA cells, per rank = per GPU): CUDA context, params ``P b``,
  grads ``P b``, optimizer state ``k P b`` (SGD with momentum: k = 1; Adam: 2),
  DDP gradient buckets ``P b`` (DDP copies gradients into flat bucket buffers),
  activations ``batch * elements_per_sample * b``; a cell that measures the timing hook's
  cost (``hook_cost_pairs``) adds a plain DDP replica's params, grads, optimizer state and
  buckets, ``(3 + k) P b`` (its activations reuse the freed ones: the two models step in turn).
- ``host`` (per node): ``r`` process baselines, a Ray node overhead, and for CPU
  cells the same model-state terms as ``device`` times ``r`` (device memory is host
  memory); for CUDA cells the host copy of the model built before ``.to(device)``
  and, for gloo, the pinned staging copies.
- ``pinned`` (CUDA + gloo only, per node): gloo reduces CUDA tensors on the host,
  staging every bucket in page-locked memory: ``r P b``.
- ``shm`` (per node, /dev/shm): the Ray records of ``r`` ranks (the object store
  lives in /dev/shm) plus NCCL's shared-memory segments on NCCL cells.
- ``object_store`` (the driver's node): the records of all ``world_size`` ranks.

After training each rank runs the all-reduce microbenchmark over the matrix's sizes and the
model's bucket sizes, with the model still held: ``MICROBENCH_PEAK_FACTOR`` times its largest
size ``S`` more (on the device for CUDA cells, per rank on the host for CPU cells).

Everything here is integer arithmetic, with no torch. Parameter counts come
from :class:`ModelFootprint`, built by :func:`model_footprint` (from the torch-free
:mod:`commprof.catalog`) or by the caller.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from commprof.caps import check_cap_mb
from commprof.catalog import GPTConfig, ResNetGeometry, model_spec
from commprof.modeling.buckets import bucket_cap_bytes
from commprof.units import format_bytes

__all__ = [
    "MIB",
    "POOLS",
    "Budgets",
    "CellShape",
    "GuardDecision",
    "ModelFootprint",
    "PoolCost",
    "detect_budgets",
    "evaluate",
    "gpt_activation_elements",
    "model_footprint",
    "resnet_activation_elements",
    "srn_activation_elements",
]

MIB = 1024 * 1024
GIB = 1024 * MIB

POOLS = ("device", "host", "pinned", "shm", "object_store")
"""Pool names, in the order a decision lists them."""
_BUDGET_FIELD = {
    "device": "device_bytes",
    "host": "host_ram_bytes",
    "pinned": "pinned_bytes",
    "shm": "shm_bytes",
    "object_store": "object_store_bytes",
}

OPTIMIZER_STATE_COPIES = {"sgd": 1, "adam": 2, "adamw": 2}
"""Parameter-sized state tensors per optimizer: SGD momentum buffer; Adam exp_avg, exp_avg_sq."""
PROCESS_BASELINE_BYTES = 512 * MIB
"""Host memory of one rank process before the model: ``import torch`` measured 268 MiB peak
RSS (torch 2.13 CPU, the 2-core machine of docs/design.md, Measured facts); Ray worker runtime
and gloo threads on top; rounded up to 512 MiB."""
RAY_NODE_OVERHEAD_BYTES = 1 * GIB
"""Raylet, GCS, dashboard (about 200 MB; docs/design.md, Measured facts) and the driver process,
per node."""
CUDA_CONTEXT_BYTES = 512 * MIB
"""Device memory of a CUDA context with cuBLAS/cuDNN workspaces and NCCL buffers (estimate)."""
NCCL_SHM_BYTES_PER_RANK = 16 * MIB
"""NCCL's /dev/shm segments per rank (estimate: proxy state plus a few 4 MiB NCCL_BUFFSIZE
buffers; why Docker's 64 MiB default /dev/shm breaks multi-GPU NCCL)."""
RECORD_BYTES = 256
"""Bytes of one returned record row (a pickled bucket row measured 217 B)."""
MICROBENCH_ROWS_BOUND = 64
"""Upper bound on microbenchmark rows per rank."""
MICROBENCH_PEAK_FACTOR = 10
"""Peak bytes of one rank's all-reduce microbenchmark per byte of its largest message size S
(``commprof.training.microbench``, float32): the source and the reduced buffer (2 S), then the
correctness check's int64 pattern, float64 expected values and float64 copy of the result (6 S)
and its bool mask (S / 4): 8.25 S; measured 8.27 S as peak RSS at S = 256 MiB (torch 2.13 CPU)
and 8.25 S at 64 MiB beside a CPU hog, but 9.03 S once inside the full test suite beside one
(cause not isolated: pages the host dropped and faulted back in at the peak are the likeliest);
10 S keeps that reading inside the term (tests/test_guard_microbench.py measures it)."""
DEFAULT_MICROBENCH_MAX_BYTES = 16 * MIB
"""Largest microbenchmark size of a cell whose matrix names none (16 KiB to 16 MiB:
``commprof.training.trainer.CALIBRATION_SIZES_BYTES``; a test keeps the two equal)."""
PINNED_FRACTION_OF_RAM = 0.5
"""Default pinned budget: page-locking more than half of RAM starves the OS (policy)."""
OBJECT_STORE_FRACTION_OF_RAM = 0.3
"""Ray's default object store size: 30 % of system memory."""


def srn_activation_elements(
    *, input_dim: int, width: int, hidden: int, depth: int, num_classes: int
) -> int:
    """Saved activations of one ScalableResidualNet sample (estimate), in elements.

    ``input_dim + depth (2 width + 2 hidden) + 2 width + 2 num_classes``: the input;
    per block the LayerNorm input and output, fc1 output (GELU input) and GELU
    output; the final LayerNorm input and output; the logits and their gradient.
    """
    return input_dim + depth * (2 * width + 2 * hidden) + 2 * width + 2 * num_classes


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def resnet_activation_elements(
    *, image_size: int, layers: tuple[int, ...], num_classes: int
) -> int:
    """Saved activations of one ResNet (BasicBlock) sample (estimate), in elements.

    Input ``3 s^2``; stem conv output and ReLU output ``2 * 64 s1^2``; max-pool output and
    indices ``2 * 64 s2^2``; per BasicBlock of ``c`` channels at side ``a``: conv1, bn1/relu,
    conv2 and block output ``4 c a^2``, plus ``c a^2`` for a downsample conv; pooled
    features 512 and ``2 num_classes`` logits. Sides follow conv arithmetic
    ``(n + 2p - k) // stride + 1``.
    """
    s1 = _conv_out(image_size, 7, 2, 3)
    side = _conv_out(s1, 3, 2, 1)
    total = 3 * image_size**2 + 2 * 64 * s1**2 + 2 * 64 * side**2
    inplanes = 64
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
        if i > 0:
            side = _conv_out(side, 3, 2, 1)
        total += 4 * planes * side**2 * blocks
        if i > 0 or inplanes != planes:
            total += planes * side**2
        inplanes = planes
    return total + 512 + 2 * num_classes


def gpt_activation_elements(
    *, seq_len: int, n_layer: int, n_head: int, n_embd: int, vocab_size: int
) -> int:
    """Saved activations of one GPT sequence (estimate), in elements.

    Per layer ``16 s h + 2 a s^2``: Korthikanti et al., "Reducing Activation
    Recomputation in Large Transformer Models" (MLSys 2023, arXiv:2205.05198), Sec. 4.1
    count ``34 s h + 5 a s^2`` bytes for 2-byte activations and 1-byte dropout masks;
    without the masks (dropout 0) that is ``16 s h + 2 a s^2`` elements (the ``s^2``
    term is kept, conservatively, although fused attention saves less). Plus the
    embedding output ``s h``, final LayerNorm ``2 s h`` and the logits with their
    log-softmax ``2 s V`` (dominant for GPT-2's 50257-token vocabulary).
    """
    s, h = seq_len, n_embd
    return n_layer * (16 * s * h + 2 * n_head * s * s) + 3 * s * h + 2 * s * vocab_size


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelFootprint:
    """What the guard needs to know about a model, as plain integers."""

    model: str
    """Model name."""
    num_parameters: int
    """Unique parameters (tied weights once)."""
    num_param_tensors: int
    """Parameter tensors (bounds the number of DDP buckets)."""
    activation_elements_per_sample: int
    """Estimated saved activation elements per sample (see the per-family functions)."""
    largest_param_elements: int = 0
    """Elements of the largest parameter tensor (a DDP bucket exceeds its cap by less than
    one); 0: unknown, the whole model bounds a bucket."""

    def __post_init__(self) -> None:
        if self.largest_param_elements < 0:
            raise ValueError(f"ModelFootprint.largest_param_elements={self.largest_param_elements}")
        for name in ("num_parameters", "num_param_tensors", "activation_elements_per_sample"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelFootprint.{name}={getattr(self, name)!r}: must be >= 1")


def model_footprint(model: str, *, image_size: int = 224, seq_len: int = 128) -> ModelFootprint:
    """Footprint of a named model, from closed-form counts (nothing is allocated).

    Args:
        model: Model name.
        image_size: Synthetic image side for ResNet (``data.RESNET_IMAGE_SIZE``).
        seq_len: Synthetic sequence length for GPT (``data.GPT_SEQ_LEN``).

    Returns:
        The footprint.
    """

    spec = model_spec(model)
    g = spec.geometry
    if isinstance(g, GPTConfig):
        act = gpt_activation_elements(
            seq_len=seq_len,
            n_layer=g.n_layer,
            n_head=g.n_head,
            n_embd=g.n_embd,
            vocab_size=g.vocab_size,
        )
    elif isinstance(g, ResNetGeometry):
        act = resnet_activation_elements(
            image_size=image_size, layers=g.layers, num_classes=g.num_classes
        )
    else:
        act = srn_activation_elements(
            input_dim=g.input_dim,
            width=g.width,
            hidden=g.hidden,
            depth=g.depth,
            num_classes=g.num_classes,
        )
    sizes = spec.parameter_sizes()
    return ModelFootprint(
        model=model,
        num_parameters=sum(n for _, n in sizes),
        num_param_tensors=len(sizes),
        activation_elements_per_sample=act,
        largest_param_elements=max((n for _, n in sizes), default=0),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class CellShape:
    """The parts of a matrix cell that decide its memory use."""

    model: str
    """Model name."""
    world_size: int
    """Ranks in the process group."""
    ranks_per_node: int
    """Ranks placed on one node (PACK on one machine: ``world_size``)."""
    backend: str
    """``gloo`` or ``nccl``."""
    device: str
    """``cpu`` or ``cuda``."""
    batch_size: int
    """Per-rank batch size."""
    bucket_cap_mb: float | None
    """DDP bucket cap in MiB; None: DDP's default."""
    optimizer: str = "sgd"
    """A key of :data:`OPTIMIZER_STATE_COPIES`."""
    dtype_bytes: int = 4
    """Bytes per parameter, gradient and activation element (fp32: 4)."""
    num_steps: int = 6
    """Training steps (scales the returned records)."""
    microbench_max_bytes: int = DEFAULT_MICROBENCH_MAX_BYTES
    """The largest all-reduce microbenchmark size the matrix names (its buffers are costed)."""
    hook_cost_pairs: int = 0
    """Pairs of hooked and plain steps after the measured ones (``Cell.hook_cost_pairs``): a
    plain replica of the model, and two record rows per pair."""

    def __post_init__(self) -> None:
        for name in ("world_size", "ranks_per_node", "batch_size", "dtype_bytes", "num_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"CellShape.{name}={value!r}: must be a positive int")
        if not isinstance(self.hook_cost_pairs, int) or self.hook_cost_pairs < 0:
            raise ValueError(
                f"CellShape.hook_cost_pairs={self.hook_cost_pairs!r}: must be an int >= 0"
            )
        if self.ranks_per_node > self.world_size:
            raise ValueError(
                f"CellShape.ranks_per_node={self.ranks_per_node} exceeds "
                f"world_size={self.world_size}"
            )
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"CellShape.backend={self.backend!r}: use 'gloo' or 'nccl'")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"CellShape.device={self.device!r}: use 'cpu' or 'cuda'")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("CellShape.backend='nccl' needs device='cuda'")
        if self.optimizer not in OPTIMIZER_STATE_COPIES:
            raise ValueError(
                f"CellShape.optimizer={self.optimizer!r}: "
                f"use one of {sorted(OPTIMIZER_STATE_COPIES)}"
            )
        check_cap_mb(self.bucket_cap_mb, "CellShape.bucket_cap_mb")
        if not isinstance(self.microbench_max_bytes, int) or self.microbench_max_bytes < 1:
            raise ValueError(
                f"CellShape.microbench_max_bytes={self.microbench_max_bytes!r}: must be a "
                "positive int"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class Budgets:
    """Bytes available in each pool (per GPU, per node, or for the object store)."""

    device_bytes: int
    """Memory of one GPU (0 where there is none)."""
    host_ram_bytes: int
    """RAM of one node."""
    pinned_bytes: int
    """Page-locked host memory one node may give to staging."""
    shm_bytes: int
    """Free space in /dev/shm of one node."""
    object_store_bytes: int
    """Ray object store capacity."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"Budgets.{f.name}={value!r}: must be a non-negative int")

    def with_overrides(self, overrides: Mapping[str, int]) -> Budgets:
        """These budgets with some replaced (e.g. the matrix file's ``budget`` section)."""
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown budget keys {unknown}: use {[f.name for f in fields(self)]}")
        return replace(self, **dict(overrides))


def detect_budgets(*, device_bytes: int = 0) -> Budgets:
    """Budgets of the machine this runs on.

    Host RAM is the physical total (``os.sysconf``), not what is free at this moment,
    so decisions are reproducible; /dev/shm is its free space; the object store is
    Ray's default share of RAM. Device memory is the caller's to find (torch knows it:
    ``commprof.training.devices.detect_budgets``), so this module stays torch-free.

    Args:
        device_bytes: Memory of the smallest GPU a rank may get; 0 without GPUs.

    Returns:
        The detected budgets.
    """
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    shm = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    return Budgets(
        device_bytes=int(device_bytes),
        host_ram_bytes=int(host),
        pinned_bytes=int(host * PINNED_FRACTION_OF_RAM),
        shm_bytes=int(shm),
        object_store_bytes=int(host * OBJECT_STORE_FRACTION_OF_RAM),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolCost:
    """Need and budget of one pool, with the terms that add up to the need."""

    pool: str
    """One of :data:`POOLS`."""
    terms: tuple[tuple[str, int], ...]
    """(label, bytes) summands of the need."""
    budget_bytes: int
    """Bytes available."""

    @property
    def need_bytes(self) -> int:
        """Sum of the terms."""
        return sum(b for _, b in self.terms)

    @property
    def ok(self) -> bool:
        """Whether the need fits the budget."""
        return self.need_bytes <= self.budget_bytes

    def explain(self) -> str:
        """``pool: a 1 KiB + b 2 KiB = 3 KiB <= budget 4 GiB: ok`` (``commprof.units``)."""
        sums = " + ".join(f"{label} {format_bytes(b)}" for label, b in self.terms)
        verdict = "<=" if self.ok else ">"
        status = "ok" if self.ok else "OVER BUDGET"
        return (
            f"{self.pool}: {sums} = {format_bytes(self.need_bytes)} {verdict} "
            f"budget {format_bytes(self.budget_bytes)}: {status}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class GuardDecision:
    """Whether a cell fits, and the arithmetic that says so."""

    cell: CellShape
    """The costed cell."""
    footprint: ModelFootprint
    """The model's footprint used."""
    pools: tuple[PoolCost, ...]
    """Every pool the cell draws on."""

    @property
    def feasible(self) -> bool:
        """True when every pool fits."""
        return all(p.ok for p in self.pools)

    @property
    def rejected_pools(self) -> tuple[str, ...]:
        """Names of the pools over budget."""
        return tuple(p.pool for p in self.pools if not p.ok)

    @property
    def reason(self) -> str:
        """The verdict in a few words: ``feasible``, ``no CUDA device`` (a CUDA cell where the
        device budget is 0 B: the nodes have no GPU) or ``over budget in <pools>``."""
        if self.feasible:
            return "feasible"
        device = next((p for p in self.pools if p.pool == "device"), None)
        if self.cell.device == "cuda" and device is not None and device.budget_bytes == 0:
            return "no CUDA device"
        return f"over budget in {', '.join(self.rejected_pools)}"

    def explain(self) -> str:
        """The verdict line, then one line per pool with its arithmetic."""
        head = self.reason if self.feasible else f"rejected: {self.reason}"
        return "\n".join([head, *(p.explain() for p in self.pools)])

    def to_record(self) -> dict[str, Any]:
        """A JSON-able dict for the dataset's ``cells`` table."""
        return {
            "feasible": self.feasible,
            "rejected_pools": list(self.rejected_pools),
            "cell": asdict(self.cell),
            "footprint": asdict(self.footprint),
            "pools": [
                {
                    "pool": p.pool,
                    "need_bytes": p.need_bytes,
                    "budget_bytes": p.budget_bytes,
                    "ok": p.ok,
                    "terms": [{"label": label, "bytes": b} for label, b in p.terms],
                }
                for p in self.pools
            ],
            "explain": self.explain(),
        }


def record_rows_per_rank(cell: CellShape, fp: ModelFootprint) -> int:
    """Upper bound on the record rows one rank returns.

    Per step: one step row, one trace-metrics row and at most
    ``min(tensors, ceil(param_bytes / cap) + 2)`` bucket rows (DDP closes a bucket once
    it reaches the cap, and the first bucket has its own smaller cap); one
    bucket-parameter row per tensor; microbenchmark rows; two rows per hook-cost pair.
    """
    _, cap_bytes = bucket_cap_bytes(cell.bucket_cap_mb)
    buckets = min(
        fp.num_param_tensors,
        math.ceil(fp.num_parameters * cell.dtype_bytes / cap_bytes) + 2,
    )
    pairs = 2 * cell.hook_cost_pairs  # one hook_cost row per arm and pair
    return cell.num_steps * (2 + buckets) + fp.num_param_tensors + MICROBENCH_ROWS_BOUND + pairs


def microbench_largest_bytes(cell: CellShape, fp: ModelFootprint) -> int:
    """The largest message the cell's microbenchmark all-reduces: the matrix's largest size or
    the largest bucket, which holds at most ``cap + largest parameter`` (DDP closes a bucket once
    it reaches the cap) and at most the model."""
    _, cap_bytes = bucket_cap_bytes(cell.bucket_cap_mb)
    largest = fp.largest_param_elements or fp.num_parameters
    bucket = min(fp.num_parameters * cell.dtype_bytes, cap_bytes + largest * cell.dtype_bytes)
    return max(cell.microbench_max_bytes, bucket)


def evaluate(
    cell: CellShape, budgets: Budgets, footprint: ModelFootprint | None = None
) -> GuardDecision:
    """Cost ``cell`` against ``budgets`` in every pool it uses.

    Args:
        cell: The cell's memory-relevant shape.
        budgets: Detected or configured budgets.
        footprint: The model's footprint; computed by :func:`model_footprint` if None.

    Returns:
        The decision with its arithmetic.

    Raises:
        ValueError: The footprint is for another model.
    """
    fp = footprint if footprint is not None else model_footprint(cell.model)
    if fp.model != cell.model:
        raise ValueError(f"footprint is for model {fp.model!r}, cell is for {cell.model!r}")
    r = cell.ranks_per_node
    p_bytes = fp.num_parameters * cell.dtype_bytes
    k = OPTIMIZER_STATE_COPIES[cell.optimizer]
    act = cell.batch_size * fp.activation_elements_per_sample * cell.dtype_bytes
    state = [
        ("params", p_bytes),
        ("grads", p_bytes),
        (f"{cell.optimizer} state ({k}x params)", k * p_bytes),
        ("ddp buckets", p_bytes),
        (f"activations ({cell.batch_size} x {fp.activation_elements_per_sample:,} el)", act),
    ]
    if cell.hook_cost_pairs:
        state.append((f"plain replica for the hook's cost ({3 + k}x params)", (3 + k) * p_bytes))
    records = record_rows_per_rank(cell, fp) * RECORD_BYTES
    largest = microbench_largest_bytes(cell, fp)
    microbench = (
        f"microbench buffers ({MICROBENCH_PEAK_FACTOR} x largest size {format_bytes(largest)})",
        MICROBENCH_PEAK_FACTOR * largest,
    )

    def per_node(label: str, b: int) -> tuple[str, int]:
        return (f"{label} [{r} ranks x {format_bytes(b)}]", r * b)

    host = [per_node("process baseline", PROCESS_BASELINE_BYTES)]
    host.append(("ray node overhead", RAY_NODE_OVERHEAD_BYTES))
    pools: list[PoolCost] = []
    if cell.device == "cuda":
        device_terms = [("cuda context", CUDA_CONTEXT_BYTES), *state, microbench]
        pools.append(
            PoolCost(pool="device", terms=tuple(device_terms), budget_bytes=budgets.device_bytes)
        )
        host.append(per_node("host copy of model before .to(cuda)", p_bytes))
        if cell.backend == "gloo":
            host.append(per_node("pinned staging", p_bytes))
    else:
        host += [per_node(label, b) for label, b in (*state, microbench)]
    pools.append(PoolCost(pool="host", terms=tuple(host), budget_bytes=budgets.host_ram_bytes))
    if cell.device == "cuda" and cell.backend == "gloo":
        pinned = (per_node("gloo staging of all buckets", p_bytes),)
        pools.append(PoolCost(pool="pinned", terms=pinned, budget_bytes=budgets.pinned_bytes))
    shm = [per_node("ray records", records)]
    if cell.backend == "nccl":
        shm.append(per_node("nccl segments", NCCL_SHM_BYTES_PER_RANK))
    pools.append(PoolCost(pool="shm", terms=tuple(shm), budget_bytes=budgets.shm_bytes))
    store = (
        (
            f"ray records [{cell.world_size} ranks x {format_bytes(records)}]",
            cell.world_size * records,
        ),
    )
    pools.append(
        PoolCost(pool="object_store", terms=store, budget_bytes=budgets.object_store_bytes)
    )
    return GuardDecision(cell=cell, footprint=fp, pools=tuple(pools))
