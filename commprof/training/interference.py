"""Interference arms of the microbenchmark: all-reduce and compute, each alone and overlapped.

Training overlaps a bucket's all-reduce with backward compute, and each slows the other: on a
CPU rank both want the same cores and memory bandwidth; on a GPU the GEMMs and the NCCL kernels
share SMs and memory (arXiv 2507.03114 measured compute 18.9 % slower on average under
overlap). Per message size ``S`` three arms measure it:

* ``comm_under_compute``: the all-reduce of ``S`` bytes timed as the idle microbenchmark does
  (barrier, then ``all_reduce(...).wait()``, max over ranks per iteration), alone and while the
  rank computes, alternating (one pair per iteration, so that load drift hits both alike): on
  CPU a thread of the rank runs matrix products back to back (a backward-like load: DDP
  backward on CPU is matrix products on the training thread, and ``torch.mm`` releases the
  GIL); on CUDA the products run on another stream.
* ``compute_under_comm``: one unit of compute (a ``COMPUTE_DIM``-square matrix product) timed
  alone and while a thread of the rank (CPU) or the communication stream (CUDA) runs all-reduces
  of ``S`` bytes back to back; a unit counts only if the all-reduces were still running when it
  ended. On CUDA each unit is timed on the host up to a synchronize of the compute stream.

* ``comm_burst``: the all-reduce alone against ``BURST_SIZE`` of them issued back to back
  without waiting (as DDP issues its buckets), all waited for at the end: the burst's time over
  ``BURST_SIZE`` is the loaded time, alternating with alone iterations as above. It measures
  what a queue of all-reduces costs beyond the link (the backend's threads waking each other;
  on a CPU host the cores they share), which a single timed all-reduce never sees. On idle
  2-core gloo ranks a burst ran faster per op (0.34 to 0.94 of one alone: the two threads
  pipeline), so the simulator's queue factor, floored at 1, was 1 there.

The comm arms' slowdown is the median of the pairs' ratios loaded / alone, the compute arm's
``time_loaded_p50 / time_alone_p50``; the quartiles ``slowdown_q25`` and ``slowdown_q75`` (of
the ratios; of the loaded units over the alone median) say how much it varies. ``slowdown_mean``
is the mean loaded time over the mean alone time: on a shared host a few loaded all-reduces
stall for a scheduler period (ten times the median and more), which a median hides and a
step's time does not (docs/design.md, Step model). Rows go to
the dataset's ``interference`` table (docs/design.md) and the step simulator takes them
(``commprof.modeling.step.calibration.interference_from_rows``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

COMPUTE_DIM = 256
"""Side of the square matrices of one compute unit (2 * 256**3 = 33.6 MFLOP)."""
ARMS = ("comm_under_compute", "compute_under_comm", "comm_burst")
"""Arm names, as the ``interference`` table's ``arm`` column holds them."""
WARMUP_ITERS = 3
"""Untimed iterations per size and arm."""
PAUSE_POLL_S = 0.001
"""How often a paused compute thread checks whether to resume (s)."""
BURST_SIZE = 8
"""All-reduces issued back to back in one iteration of the burst arm."""
MAX_BACKGROUND_ALLREDUCES = 400
"""Most all-reduces the compute-under-comm arm runs behind one size."""


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = float(values[0])
        return v, v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def _max_over_ranks(values: list[int], device: torch.device) -> list[int]:
    """Per iteration, the max over ranks (the collective's time)."""
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    local = torch.tensor(values, dtype=torch.int64, device=where)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return [int(v) for v in local.cpu().tolist()]


class _Background:
    """Runs ``body(stop)`` on a thread until ``stop`` is set (or ``body`` returns)."""

    def __init__(self, body: Callable[[threading.Event], None]) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                body(self.stop)
            except BaseException as err:  # re-raised on the main thread in join()
                self.errors.append(err)

        self.thread = threading.Thread(target=run, daemon=True)

    def __enter__(self) -> _Background:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        if self.errors:
            raise self.errors[0]


def _compute_unit(device: torch.device) -> Callable[[], None]:
    a = torch.randn(COMPUTE_DIM, COMPUTE_DIM, device=device)
    b = torch.randn(COMPUTE_DIM, COMPUTE_DIM, device=device)
    out = torch.empty_like(a)

    def unit() -> None:
        torch.mm(a, b, out=out)

    return unit


def _time_allreduce(buf: torch.Tensor, device: torch.device) -> int:
    """One all-reduce, all ranks starting together; its duration on this rank."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # sync point: outside the window
    dist.barrier()  # sync point: all ranks start together
    start = time.perf_counter_ns()
    work = dist.all_reduce(buf, async_op=True)
    assert work is not None
    work.wait()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # sync point: reduction done
    return time.perf_counter_ns() - start


def _time_burst(buf: torch.Tensor, device: torch.device) -> int:
    """``BURST_SIZE`` all-reduces issued at once, all ranks starting together; per one."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # sync point: outside the window
    dist.barrier()  # sync point: all ranks start together
    start = time.perf_counter_ns()
    works = [dist.all_reduce(buf, async_op=True) for _ in range(BURST_SIZE)]
    for work in works:
        assert work is not None
        work.wait()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # sync point: reductions done
    return (time.perf_counter_ns() - start) // BURST_SIZE


def _comm_burst(numel: int, iters: int, device: torch.device) -> tuple[list[int], list[int]]:
    """(alone, per-op in a burst) durations, max over ranks, in alternating pairs."""
    buf = torch.ones(numel, device=device)
    alone: list[int] = []
    burst: list[int] = []
    for it in range(WARMUP_ITERS + iters):
        one, many = _time_allreduce(buf, device), _time_burst(buf, device)
        if it >= WARMUP_ITERS:
            alone.append(one)
            burst.append(many)
    return _max_over_ranks(alone, device), _max_over_ranks(burst, device)


def _comm_under_compute(
    numel: int, iters: int, device: torch.device
) -> tuple[list[int], list[int]]:
    """(alone, loaded) durations, max over ranks, in alternating pairs.

    Alone and loaded iterations alternate (the compute thread paused and resumed between them)
    so that a drift of the host's load hits both alike: each pair's ratio is a slowdown.
    """
    buf = torch.ones(numel, device=device)
    unit = _compute_unit(device)
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    loading = threading.Event()

    def compute(stop: threading.Event) -> None:
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            while not stop.is_set():
                if not loading.wait(timeout=PAUSE_POLL_S):
                    continue
                unit()
                if side is not None:
                    side.synchronize()  # sync point: keeps a bounded queue of GEMMs

    alone: list[int] = []
    loaded: list[int] = []
    with _Background(compute):
        for it in range(WARMUP_ITERS + iters):
            for out, load in ((alone, False), (loaded, True)):
                if load:
                    loading.set()
                else:
                    loading.clear()
                duration = _time_allreduce(buf, device)
                if it >= WARMUP_ITERS:
                    out.append(duration)
        loading.clear()
    return _max_over_ranks(alone, device), _max_over_ranks(loaded, device)


def _time_units(unit: Callable[[], None], count: int, device: torch.device) -> list[int]:
    out = []
    for _ in range(count):
        start = time.perf_counter_ns()
        unit()
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # sync point: unit done
        out.append(time.perf_counter_ns() - start)
    return out


def _compute_under_comm(
    numel: int, iters: int, device: torch.device, comm_ns: int
) -> tuple[list[int], list[int]]:
    unit = _compute_unit(device)
    _time_units(unit, WARMUP_ITERS, device)
    dist.barrier()
    alone = _time_units(unit, iters, device)
    unit_ns = _max_over_ranks([int(statistics.median(alone))], device)[0]
    # Enough all-reduces (the same count on every rank) to cover about 2 * iters units.
    count = max(2, min(MAX_BACKGROUND_ALLREDUCES, math.ceil(2 * iters * unit_ns / max(comm_ns, 1))))
    buf = torch.ones(numel, device=device)
    finished = threading.Event()

    def comm(stop: threading.Event) -> None:
        for _ in range(count):
            work = dist.all_reduce(buf, async_op=True)
            assert work is not None
            work.wait()
        finished.set()

    loaded: list[int] = []
    dist.barrier()
    with _Background(comm):
        while not finished.is_set():
            (duration,) = _time_units(unit, 1, device)
            if not finished.is_set():
                loaded.append(duration)
    dist.barrier()
    return alone, loaded or [unit_ns]


def interference_record(
    alone_ns: Sequence[int], loaded_ns: Sequence[int], *, arm: str, num_bytes: int
) -> dict[str, object]:
    """One ``interference`` row from the alone and loaded durations of one arm and size.

    The comm arms' durations come in pairs (iteration i alone, then loaded): their slowdown and
    quartiles are those of the pairs' ratios. The compute arm's loaded units are many short
    ones against the alone median: loaded quartiles over the alone median.
    """
    if arm not in ARMS or not alone_ns or not loaded_ns:
        raise ValueError(f"arm must be one of {ARMS} with durations, got {arm!r}")
    alone_p50 = statistics.median(alone_ns)
    p50 = statistics.median(loaded_ns)
    if arm != ARMS[1]:
        if len(alone_ns) != len(loaded_ns):
            raise ValueError("the comm arm's alone and loaded durations come in pairs")
        q25, ratio, q75 = _quartiles([lo / al for al, lo in zip(alone_ns, loaded_ns, strict=True)])
    else:
        q25, ratio, q75 = (q / alone_p50 for q in _quartiles(loaded_ns))
    return {
        "arm": arm,
        "num_bytes": int(num_bytes),
        "num_iters_alone": len(alone_ns),
        "num_iters_loaded": len(loaded_ns),
        "time_alone_p50_ns": int(alone_p50),
        "time_loaded_p50_ns": int(p50),
        "slowdown": ratio,
        "slowdown_q25": q25,
        "slowdown_q75": q75,
        "slowdown_mean": statistics.fmean(loaded_ns) / statistics.fmean(alone_ns),
    }


def run_interference_bench(
    sizes_bytes: Sequence[int], *, iters: int, device: torch.device | str
) -> list[dict[str, object]]:
    """Both arms for every size, inside an initialised process group (same call on every rank).

    Args:
        sizes_bytes: Message sizes (float32 elements, rounded down, at least one).
        iters: Timed iterations per size and arm (>= 1).
        device: Where buffers and compute live.

    Returns:
        Three rows per size, one per arm of :data:`ARMS` (fields of
        :func:`interference_record`); the comm arms are identical on every rank, the compute
        arm is this rank's.
    """
    if not dist.is_initialized():
        raise RuntimeError("run_interference_bench needs an initialised process group")
    if iters < 1:
        raise ValueError(f"interference iters must be >= 1, got {iters}")
    dev = torch.device(device)
    rows: list[dict[str, object]] = []
    for size in sizes_bytes:
        numel = max(1, int(size) // 4)
        alone, loaded = _comm_under_compute(numel, iters, dev)
        rows.append(interference_record(alone, loaded, arm=ARMS[0], num_bytes=numel * 4))
        comm_ns = int(statistics.median(alone))
        alone_c, loaded_c = _compute_under_comm(numel, iters, dev, comm_ns)
        rows.append(interference_record(alone_c, loaded_c, arm=ARMS[1], num_bytes=numel * 4))
        alone_b, burst = _comm_burst(numel, iters, dev)
        rows.append(interference_record(alone_b, burst, arm=ARMS[2], num_bytes=numel * 4))
    return rows
