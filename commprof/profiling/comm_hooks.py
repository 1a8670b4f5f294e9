"""DDP communication hooks that time every gradient bucket without perturbing it.

The timing wrapper keeps PyTorch's hook shape, ``hook(state, bucket) -> Future[Tensor]``, and
composes with any inner hook (plain all-reduce, fp16 compression), the way
``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_wrapper`` composes.
It never touches the gradients: the inner hook's future is returned with one extra ``then``
that only reads a clock. Around PyTorch's ``allreduce_hook`` (the default, and ``commprof run``'s
``allreduce``) that ``then`` is the only one: the wrapper runs the same division and all-reduce
(:func:`allreduce_unwrapped`) and its callback also takes the reduced tensor out of the work's
list, which ``allreduce_hook`` does in a ``then`` of its own. Each Python callback takes the GIL
on the backend's thread: on 2-core gloo ranks with five buckets of about 80 KiB a step, the
wrapper with one callback made the step 0.90 [0.84, 1.01] of its two-callback form
(benchmarks/README.md, "Timing hook"; an interval this host does not separate from 1).

Per bucket it takes three host timestamps (``time.perf_counter_ns``, one process-wide clock):

- ``ready_ns``: hook entry, when DDP found the bucket's gradients ready;
- ``launch_ns``: after the inner hook returned, i.e. the collective is enqueued;
- ``done_ns``: in the future's callback, when the collective has completed.

On CUDA it also records an event pair, at hook entry on the current stream and in the callback
on the stream the future completes on; the pair is resolved with ``elapsed_time`` after the step
(:meth:`TimingState.resolve`), never in the hook. On CUDA the derived columns (latency,
transfer, exposed) come from these device times, not from the host clock: NCCL completes its
future as soon as the kernel is enqueued (the callback then runs with stream semantics), so the
host ``done_ns`` marks the enqueue there, not the end of the transfer. The hot path holds no
device sync, no lock and no blocking call: a ``perf_counter_ns``, a list append, and on CUDA
two ``Event.record``.

Definitions (docs/design.md): ``latency_ns = done_ns - ready_ns``, from the hand-over to the
backend until the reduced gradients are there, the enqueue included. It is measured from hook
entry, not from ``launch_ns``: a collective can complete on a gloo worker thread while the
launching thread is descheduled between the enqueue and its next clock read, which made
``done - launch`` read microseconds for transfers of tens of milliseconds on a loaded machine.
``launch_ns - ready_ns`` is the enqueue cost on the training thread. Latency includes waiting
behind the step's earlier buckets (a backend runs a process group's collectives in order; gloo
has two worker threads, so two may overlap). ``transfer_ns = done_ns - max(ready_ns, d)``, with
``d`` the latest completion of an earlier bucket that finished before this one, approximates
the bucket's own service time, the quantity a cost model predicts; the trace's collective
durations are the exact figure. The step's backward compute ends when the last bucket becomes
ready (its gradients are the last ones autograd produces), so a bucket's ``exposed_ns =
max(0, done_ns - max(ready_ns, compute_end_ns))``, with ``compute_end_ns`` the latest
``ready_ns`` of the step: the part of its communication that no compute overlapped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]

INNER_HOOKS: dict[str, Hook] = {
    "allreduce": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
}
"""Inner hooks by the matrix's ``hook`` name; both take a process group (or None) as state."""


def allreduce_unwrapped(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[list[torch.Tensor]]:
    """``default_hooks.allreduce_hook`` without its last ``then``: the bucket divided by the world
    size and all-reduced (a sum), the work's own future returned, whose value is a one-tensor
    list. DDP cannot take it as it is; :func:`timing_wrapper`'s callback unwraps it."""
    group = process_group if process_group is not None else dist.group.WORLD
    assert group is not None  # DDP runs in an initialised default group
    buffer = bucket.buffer()
    buffer.div_(group.size())
    work = dist.all_reduce(buffer, group=group, async_op=True)
    assert work is not None  # async_op=True always gives a work
    return work.get_future()


# Buckets are rebuilt at the end of step 0 (DDP rebuilds them from the order gradients became
# ready), so composition is recorded once, on step 1, when it is final.
COMPOSITION_STEP = 1

# Indices into a raw record (a list, so the callback can fill in done_ns in place).
_STEP, _INDEX, _BYTES, _PARAMS, _READY, _LAUNCH, _DONE, _EV_READY, _EV_DONE = range(9)


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketParam:
    """One parameter's place in a gradient bucket."""

    bucket_index: int
    """DDP's bucket index (0 is the bucket launched first)."""
    position: int
    """Position of the parameter inside the bucket."""
    param_name: str
    """Fully qualified parameter name, as ``named_parameters`` gives it."""
    module: str
    """The owning module's path (the parameter name without its last component; empty for a
    parameter of the root module)."""
    module_type: str
    """The owning module's class name (``Linear``), so that a path such as ``2`` (an index in an
    ``nn.Sequential``) reads as a layer; empty where the module is unknown."""
    numel: int
    """Number of elements."""
    num_bytes: int
    """numel times element size."""


class TimingState:
    """State of the timing wrapper: the inner hook's state and the records of each step.

    Args:
        inner_state: the state the inner hook expects (a process group, or None for the default).
        param_names: ``id(parameter) -> name`` for composition records.
        module_types: ``module path -> class name`` (:func:`module_types`) for composition
            records.
        use_cuda_events: record CUDA event pairs too (cuda tensors only).
    """

    def __init__(
        self,
        inner_state: Any = None,
        *,
        param_names: dict[int, str] | None = None,
        module_types: dict[str, str] | None = None,
        use_cuda_events: bool = False,
    ) -> None:
        self.inner_state = inner_state
        self.param_names = param_names or {}
        self.module_types = module_types or {}
        self.use_cuda_events = use_cuda_events
        self.step = 0
        self.recording = True
        """False: the hook passes buckets to the inner hook untimed (``commprof.attach`` turns
        it off when its session ends; DDP cannot unregister a hook)."""
        self.raw: list[list[Any]] = []
        self.composition: list[BucketParam] = []
        self.num_buckets = 0
        """Buckets handed to the hook, timed or not: equal on every rank of a sound run
        (``commprof.attach`` compares them at its end)."""

    def last_done_ns(self, step: int) -> int | None:
        """Host clock when the last collective of ``step`` completed (None: no bucket yet).

        Reads the records not resolved yet; call it before :meth:`resolve`.
        """
        done = [rec[_DONE] for rec in self.raw if rec[_STEP] == step and rec[_DONE]]
        return max(done) if done else None

    def device_done(self, step: int) -> bool:
        """Whether every CUDA event of ``step``'s records has completed (a non-blocking query;
        True off CUDA): :meth:`resolve` of that step can then read them without waiting."""
        return all(
            ev.query() for rec in self.raw if rec[_STEP] == step for ev in rec[_EV_READY:] if ev
        )

    def resolve(self, *, before_step: int | None = None) -> list[dict[str, Any]]:
        """Turn the raw records of all steps so far into bucket rows, then forget them.

        Call after a step has completed (on CUDA after the step's sync point), never in a hook.

        Args:
            before_step: resolve only the records of earlier steps and keep the rest (on CUDA
                the latest step's events may still be pending).

        Returns:
            Rows with ``step, bucket_index, num_bytes, num_params, ready_ns, launch_ns, done_ns,
            latency_ns, transfer_ns, exposed_ns, device_latency_ns`` (the last is None off
            CUDA), in order of readiness.
        """
        if before_step is None:
            raw, self.raw = self.raw, []
        else:
            raw = [rec for rec in self.raw if rec[_STEP] < before_step]
            self.raw = [rec for rec in self.raw if rec[_STEP] >= before_step]
        for rec in raw:
            if rec[_DONE] == 0:
                self.raw = raw + self.raw  # keep every record for a later resolve()
                raise RuntimeError(
                    f"bucket {rec[_INDEX]} of step {rec[_STEP]} has not completed; "
                    "resolve() must be called after the step"
                )
        params_per_bucket: dict[int, int] = {}
        for param in self.composition:
            params_per_bucket[param.bucket_index] = params_per_bucket.get(param.bucket_index, 0) + 1
        raw.sort(key=lambda r: (r[_STEP], r[_READY]))
        on_device = bool(raw) and all(rec[_EV_READY] is not None for rec in raw)
        derived = _derive(
            _device_times(raw) if on_device else [(r[_READY], r[_DONE]) for r in raw],
            [r[_STEP] for r in raw],
        )
        rows = []
        for rec, (latency, transfer, exposed) in zip(raw, derived, strict=True):
            rows.append(
                {
                    "step": rec[_STEP],
                    "bucket_index": rec[_INDEX],
                    "num_bytes": rec[_BYTES],
                    "num_params": (
                        rec[_PARAMS] if rec[_PARAMS] >= 0 else params_per_bucket[rec[_INDEX]]
                    ),
                    "ready_ns": rec[_READY],
                    "launch_ns": rec[_LAUNCH],
                    "done_ns": rec[_DONE],
                    "latency_ns": latency,
                    "transfer_ns": transfer,
                    "exposed_ns": exposed,
                    "device_latency_ns": latency if on_device else None,
                }
            )
        return rows

    def _record_composition(self, bucket: dist.GradBucket) -> None:
        index = bucket.index()
        if any(p.bucket_index == index for p in self.composition):
            return
        for position, param in enumerate(bucket.parameters()):
            name = self.param_names.get(id(param), f"<unnamed {id(param)}>")
            module = name.rpartition(".")[0]
            self.composition.append(
                BucketParam(
                    bucket_index=index,
                    position=position,
                    param_name=name,
                    module=module,
                    module_type=self.module_types.get(module, ""),
                    numel=param.numel(),
                    num_bytes=param.numel() * param.element_size(),
                )
            )


def module_types(model: torch.nn.Module) -> dict[str, str]:
    """``module path -> class name`` of every module of ``model`` (the root's path is empty)."""
    return {name: type(module).__name__ for name, module in model.named_modules()}


def _device_times(raw: list[list[Any]]) -> list[tuple[int, int]]:
    """(ready, done) of each record in ns on the device clock, from its CUDA event pair.

    Offsets are taken from the step's first ready event: only differences within a step are
    used, so no common reference with the host clock is needed.
    """
    first: dict[int, Any] = {}
    out = []
    for rec in raw:
        ref = first.setdefault(rec[_STEP], rec[_EV_READY])
        ready_ms = ref.elapsed_time(rec[_EV_READY])
        done_ms = ref.elapsed_time(rec[_EV_DONE])
        out.append((round(ready_ms * 1e6), round(done_ms * 1e6)))
    return out


def _derive(times: list[tuple[int, int]], steps: list[int]) -> list[tuple[int, int, int]]:
    """(latency, transfer, exposed) per bucket from (ready, done) times (module docstring).

    Args:
        times: (ready_ns, done_ns) per bucket, on one clock, sorted by (step, ready).
        steps: each bucket's step.
    """
    compute_end: dict[int, int] = {}
    for (ready, _), step in zip(times, steps, strict=True):
        compute_end[step] = max(compute_end.get(step, ready), ready)
    earlier_done: dict[int, list[int]] = {}
    out = []
    for (ready, done), step in zip(times, steps, strict=True):
        done_before = [d for d in earlier_done.setdefault(step, []) if d <= done]
        earlier_done[step].append(done)
        service_start = max([ready, *done_before])
        out.append(
            (done - ready, done - service_start, max(0, done - max(ready, compute_end[step])))
        )
    return out


def timing_wrapper(inner: Hook) -> Callable[[TimingState, dist.GradBucket], Any]:
    """Wrap a communication hook so that every bucket it handles is timed.

    Args:
        inner: a hook ``(state, bucket) -> Future[Tensor]``; it receives ``state.inner_state``.
            PyTorch's ``allreduce_hook`` runs as :func:`allreduce_unwrapped` while the state
            records (one callback a bucket, not two); any other hook runs as it is.

    Returns:
        A hook taking a :class:`TimingState`; register it with
        ``ddp.register_comm_hook(timing_state, hook)``.
    """

    fused = inner is default_hooks.allreduce_hook  # by identity: a user's hook may not hash
    launch = allreduce_unwrapped if fused else inner

    def hook(state: TimingState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        state.num_buckets += 1
        if not state.recording:
            return inner(state.inner_state, bucket)
        ready_ns = time.perf_counter_ns()
        ev_ready = ev_done = None
        if state.use_cuda_events:
            ev_ready = torch.cuda.Event(enable_timing=True)
            ev_ready.record()
        if state.step == COMPOSITION_STEP:
            state._record_composition(bucket)
        buffer = bucket.buffer()
        fut = launch(state.inner_state, bucket)
        rec = [
            state.step,
            bucket.index(),
            buffer.numel() * buffer.element_size(),
            # Counted while the layout may still change; later steps take it from composition.
            len(bucket.parameters()) if state.step <= COMPOSITION_STEP else -1,
            ready_ns,
            time.perf_counter_ns(),
            0,
            ev_ready,
            ev_done,
        ]
        state.raw.append(rec)

        # Runs on the backend's completion thread (gloo worker / CUDA callback): only reads a
        # clock and records an event; never blocks, never starts a collective (docs/design.md,
        # Measured facts).
        def done(f: torch.futures.Future[Any]) -> torch.Tensor:
            rec[_DONE] = time.perf_counter_ns()
            if rec[_EV_READY] is not None:
                event = torch.cuda.Event(enable_timing=True)
                # on the bucket's device: a gloo worker thread's current device is cuda:0
                event.record(torch.cuda.current_stream(buffer.device))
                rec[_EV_DONE] = event
            value = f.value()
            return value[0] if fused else value

        return fut.then(done)

    hook.__name__ = f"timed_{getattr(inner, '__name__', 'hook')}"
    # DDP compares the annotations to the real types; postponed evaluation would give strings.
    hook.__annotations__ = {
        "state": TimingState,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook


def register_timing_hook(
    ddp: torch.nn.parallel.DistributedDataParallel,
    *,
    inner: str = "allreduce",
    process_group: Any = None,
) -> TimingState:
    """Register the timing wrapper around a named inner hook on a DDP model.

    Args:
        ddp: the wrapped model (before its first backward).
        inner: ``allreduce`` or ``fp16`` (``INNER_HOOKS``).
        process_group: the group the inner hook reduces over (None: the default group).

    Returns:
        The state holding the records.
    """
    if inner not in INNER_HOOKS:
        raise ValueError(f"hook {inner!r} is not one of: {', '.join(INNER_HOOKS)}")
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    on_cuda = next(ddp.module.parameters()).is_cuda
    state = TimingState(
        process_group,
        param_names=names,
        module_types=module_types(ddp.module),
        use_cuda_events=on_cuda,
    )
    ddp.register_comm_hook(state, timing_wrapper(INNER_HOOKS[inner]))
    return state
