"""All-reduce microbenchmark with nccl-tests conventions (torch.distributed, any backend).

Conventions (nccl-tests, doc/PERFORMANCE.md): algbw = S / t; all-reduce
busbw = algbw * 2(p-1)/p; GB is 1e9 bytes; the reduced values are checked and
the number of wrong elements reported (nccl-tests' ``#wrong``).

Passes. The sizes are visited in ``passes`` rounds, each in its own seeded shuffled
order (the same on every rank), and a size's timed iterations are pooled over the
rounds: a burst of outside load then blurs a few iterations of many sizes rather
than all iterations of one (one experiment on a shared 2-core host: fits from 4 of
16 recorded passes missed held-out sizes by 9.2 % on average, from all 16 by 6.9 %;
benchmarks/README.md).
Sizes above ``large_above_bytes`` run ``large_timed_iters`` and
``large_warmup_iters``, as the OSU micro-benchmarks do with ``iterations_large``
and ``skip_large`` above ``LARGE_MESSAGE_SIZE``.

Timing. Before each timed iteration every rank refills its buffer (outside the
timed window) and enters a barrier, so all ranks start together; each rank then
times ``all_reduce(...).wait()`` with ``time.perf_counter_ns`` (CUDA: after a
device synchronize). The iteration's time is the MAX over ranks of that
iteration's duration: an all-reduce is finished only when the last rank has its
result, so the slowest rank is the collective's time (barrier exit skew, a few
microseconds on loopback gloo, is included and not removed). Per size we report
the median (p50), mean, min and max of those per-iteration times, identical on every
rank because the durations are all-gathered. The median is the link's time; the mean is what a
training step pays on average, stalls included (on a shared CPU host about 4 in 10 all-reduces
of 64 KiB stalled for 2 to 8 ms against 0.2 to 0.4 ms otherwise; docs/design.md).

Correctness. Rank r fills element i with (r + 1) * (i % 4 + 1), so the sum is
p(p+1)/2 * (i % 4 + 1) in closed form; all partial sums are small integers and
exact in every supported dtype for p <= 8 (bf16 holds integers up to 256
exactly).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from commprof.matrix import geometric_sizes as geometric_sizes  # torch-free home; re-exported
from commprof.modeling.collective.cost_model import bus_bandwidth_factor

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
"""Supported element types by name."""
DEFAULT_WARMUP_ITERS = 5
"""Untimed iterations per size (connection setup, allocator, caches)."""
DEFAULT_TIMED_ITERS = 20
"""Timed iterations per size."""
FILL_PERIOD = 4
"""Element i of rank r holds (r + 1) * (i % FILL_PERIOD + 1)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MicrobenchConfig:
    """What to measure."""

    sizes_bytes: tuple[int, ...]
    """Message sizes in bytes; each is rounded down to whole elements (at least one)."""
    warmup_iters: int = DEFAULT_WARMUP_ITERS
    """Untimed iterations before the timed ones, per size in each pass."""
    timed_iters: int = DEFAULT_TIMED_ITERS
    """Timed iterations per size in each pass."""
    dtype: str = "float32"
    """Element type, one of ``DTYPES``."""
    passes: int = 1
    """Rounds over all sizes, each in a shuffled order; iterations are pooled over rounds."""
    seed: int = 0
    """Seed of the pass orders (pass k uses ``random.Random(seed + k)``)."""
    large_above_bytes: int | None = None
    """Sizes above this use the ``large_*`` iteration counts; None: every size is small."""
    large_warmup_iters: int = DEFAULT_WARMUP_ITERS
    """Untimed iterations per large size in each pass."""
    large_timed_iters: int = DEFAULT_TIMED_ITERS
    """Timed iterations per large size in each pass."""

    def __post_init__(self) -> None:
        if not self.sizes_bytes:
            raise ValueError("sizes_bytes must not be empty")
        bad = [s for s in self.sizes_bytes if int(s) <= 0]
        if bad:
            raise ValueError(f"sizes_bytes must be > 0, got {bad}")
        for name in ("warmup_iters", "large_warmup_iters"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("timed_iters", "large_timed_iters", "passes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.large_above_bytes is not None and self.large_above_bytes < 0:
            raise ValueError(f"large_above_bytes must be >= 0, got {self.large_above_bytes}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPES)}")

    def iters(self, num_bytes: int) -> tuple[int, int]:
        """(warm-up, timed) iterations of one size in one pass."""
        if self.large_above_bytes is not None and num_bytes > self.large_above_bytes:
            return self.large_warmup_iters, self.large_timed_iters
        return self.warmup_iters, self.timed_iters

    def pass_order(self, index: int) -> list[int]:
        """Positions into ``sizes_bytes`` in the order pass ``index`` visits them."""
        order = list(range(len(self.sizes_bytes)))
        if self.passes > 1:
            random.Random(self.seed + index).shuffle(order)
        return order


def _fill(buf: torch.Tensor, rank: int) -> None:
    pattern = torch.arange(buf.numel(), device=buf.device) % FILL_PERIOD + 1
    buf.copy_(pattern.to(buf.dtype) * (rank + 1))


def _count_wrong(buf: torch.Tensor, world_size: int) -> int:
    pattern = torch.arange(buf.numel(), device=buf.device) % FILL_PERIOD + 1
    expected = pattern.to(torch.float64) * (world_size * (world_size + 1) // 2)
    return int((buf.to(torch.float64) != expected).sum().item())


def _time_size(
    numel: int, config: MicrobenchConfig, *, rank: int, device: torch.device
) -> tuple[list[int], int]:
    dtype = DTYPES[config.dtype]
    source = torch.empty(numel, dtype=dtype, device=device)
    _fill(source, rank)
    buf = torch.empty_like(source)
    warmup_iters, timed_iters = config.iters(numel * source.element_size())
    durations: list[int] = []
    for it in range(warmup_iters + timed_iters):
        buf.copy_(source)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # sync point: refill done before timing
        dist.barrier()  # sync point: all ranks start the iteration together
        start_ns = time.perf_counter_ns()
        work = dist.all_reduce(buf, async_op=True)
        assert work is not None
        work.wait()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # sync point: reduction finished on device
        end_ns = time.perf_counter_ns()
        if it >= warmup_iters:
            durations.append(end_ns - start_ns)
    return durations, _count_wrong(buf, dist.get_world_size())


def size_record(
    per_rank_ns: Sequence[Sequence[int]],
    num_wrong: int,
    *,
    num_bytes: int,
    dtype: str,
    world_size: int,
) -> dict[str, object]:
    """The microbench record of one size from every rank's timed durations (no process group).

    An iteration's time is the max over ranks (module docstring); algbw = S / t_p50 and
    busbw = algbw * 2(p-1)/p (``commprof.modeling.collective.cost_model.bus_bandwidth_factor``,
    nccl-tests doc/PERFORMANCE.md), in decimal GB/s. ``transfer_p50_ns`` is the median over
    iterations of the SHORTEST duration across ranks: the rank that left the barrier last
    waited for nobody, so its time is the collective's transfer and the others' excess is
    waiting (transfer vs wait, as for trace collectives; docs/design.md, Definitions); it is what
    a link model predicts without the barrier-exit skew a busy host adds.

    Args:
        per_rank_ns: ``[rank][iteration]`` durations in ns, all ranks the same length.
        num_wrong: Wrong elements, summed over ranks.
        num_bytes: Message size S in bytes.
        dtype: Element type name.
        world_size: Number of ranks p.

    Returns:
        The record, fields as :func:`run_allreduce_bench` returns them.
    """
    if world_size < 1 or len(per_rank_ns) != world_size or not per_rank_ns[0]:
        raise ValueError(
            f"per_rank_ns needs {world_size} ranks of durations, got {len(per_rank_ns)} ranks"
        )
    per_iter_ns = [max(column) for column in zip(*per_rank_ns, strict=True)]
    transfer_ns = [min(column) for column in zip(*per_rank_ns, strict=True)]
    p50_ns = int(statistics.median(per_iter_ns))
    algbw_gbps = num_bytes / (p50_ns * 1e-9) / 1e9 if p50_ns > 0 else float("inf")
    return {
        "num_bytes": num_bytes,
        "dtype": dtype,
        "num_iters": len(per_iter_ns),
        "time_p50_ns": p50_ns,
        "time_min_ns": int(min(per_iter_ns)),
        "time_max_ns": int(max(per_iter_ns)),
        "transfer_p50_ns": int(statistics.median(transfer_ns)),
        "time_mean_ns": round(statistics.fmean(per_iter_ns)),
        "algbw_gbps": algbw_gbps,
        "busbw_gbps": algbw_gbps * float(bus_bandwidth_factor(world_size)),
        "num_wrong": int(num_wrong),
    }


def run_allreduce_bench(
    config: MicrobenchConfig, *, rank: int, world_size: int, device: torch.device | str
) -> list[dict[str, object]]:
    """Run the all-reduce microbenchmark inside an initialised process group.

    Args:
        config: Sizes, iterations and dtype.
        rank: This process's rank.
        world_size: Number of ranks in the default group.
        device: Where the buffers live (``cpu`` or ``cuda:N``).

    Returns:
        One record per size, in ``config.sizes_bytes`` order, identical on every rank, with
        fields num_bytes, dtype, num_iters (pooled over passes), time_p50_ns, time_min_ns,
        time_max_ns, transfer_p50_ns, time_mean_ns, algbw_gbps, busbw_gbps, num_wrong.
    """
    if not dist.is_initialized():
        raise RuntimeError("run_allreduce_bench needs an initialised process group")
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise ValueError(
            f"rank/world_size ({rank}/{world_size}) disagree with the process group "
            f"({dist.get_rank()}/{dist.get_world_size()})"
        )
    dev = torch.device(device)
    elem = torch.empty((), dtype=DTYPES[config.dtype]).element_size()
    gather_dev = dev if dist.get_backend() == "nccl" else torch.device("cpu")
    durations: list[list[int]] = [[] for _ in config.sizes_bytes]
    num_wrong = [0] * len(config.sizes_bytes)
    for index in range(config.passes):
        for pos in config.pass_order(index):
            numel = max(1, int(config.sizes_bytes[pos]) // elem)
            timed, wrong = _time_size(numel, config, rank=rank, device=dev)
            durations[pos].extend(timed)
            num_wrong[pos] += wrong
    records: list[dict[str, object]] = []
    for pos, size in enumerate(config.sizes_bytes):
        numel = max(1, int(size) // elem)
        local = torch.tensor(
            [*durations[pos], num_wrong[pos]], dtype=torch.int64, device=gather_dev
        )
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        table = torch.stack(gathered).cpu()  # [rank, iteration..., wrong]
        records.append(
            size_record(
                table[:, :-1].tolist(),
                int(table[:, -1].sum()),
                num_bytes=numel * elem,
                dtype=config.dtype,
                world_size=world_size,
            )
        )
    return records
