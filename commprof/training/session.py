"""commprof inside your own training: ``commprof.attach(ddp_model, ...)`` and its session.

The session registers the timing hook on a ``DistributedDataParallel`` model (around the
user's own comm hook when one is given), optionally runs the profiler harness over a range of
steps, and takes the step boundaries from ``session.step()``, called once at the end of every
training step. When the ``with`` block ends it writes one attempt into a dataset folder, in the
same tables a sweep writes (``commprof.results.commit_attempt``), so ``commprof report``,
``commprof analyze DIR/traces/<cell>-a1`` and ``commprof estimate --fit DIR`` read it unchanged.

Example (under ``torchrun --nproc_per_node 2``)::

    with commprof.attach(ddp, out="commprof-run", profile_steps=range(2, 5)) as run:
        for batch in loader:
            ...  # forward, backward, optimizer step
            run.step()

What a step costs (the hot path): the timing wrapper per bucket (three clock reads and a list
append, benchmarks/README.md), a clock read in a forward pre-hook and a forward hook on the DDP
module, and in ``step()`` one clock read and the resolution of the step's bucket records into
rows (tens of microseconds, after the step's work has completed). No device sync anywhere in the
steps: on CUDA a step's CUDA events are resolved once they have completed (a non-blocking
query), and the one sync point is at the end of the session.

Step phases, host clock: a step starts at its first forward (the pre-hook), its forward ends at
its last forward's return, its backward at the completion of its last bucket's collective (DDP
returns from ``backward()`` right after it), its optimizer phase at ``step()``. Data loading
before the first forward is not part of a step. On CUDA, without a sync in the user's step,
host times are enqueue times; the bucket rows carry device times (CUDA events) there.

How the ranks' rows reach the dataset: when the block ends, every rank resolves its records,
derives its trace metrics, runs the short all-reduce microbenchmark over the model's bucket
sizes (what ``estimate --fit`` fits; ``microbench_iters=0`` skips it), then one
``gather_object`` on the DDP model's process group brings every rank's records to its rank 0,
which commits them under the folder's lock (``commprof.lock``) and broadcasts the outcome: every
rank returns from the block after the commit, or raises its error. All of it runs after the last
step, outside the hot path. A block left by an exception writes nothing and starts no
collective (a peer may be gone).

The run is described by a ``cells`` row like a sweep cell's: model class name and parameter
count, world size, backend, device, bucket cap (None: DDP's default), hook, steps, versions
(``env_json``). Its cell id hashes that configuration; running the same configuration again
into the same folder adds a repeat (``repeat`` 0, 1, ...), as a matrix's ``repeats`` does.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from commprof.matrix import ID_FIELDS, config_hash, regime_of
from commprof.profiling.comm_hooks import Hook, TimingState, module_types, timing_wrapper
from commprof.profiling.harness import HarnessConfig, ProfilerHarness

DEFAULT_MAX_STEPS = 1000
"""Steps whose rows a session keeps by default; later steps run with the hook passing through."""
DEFAULT_MICROBENCH_ITERS = 5
"""Timed all-reduce iterations per message size at the end of a session."""
DEFAULT_MICROBENCH_SIZES_BYTES = (2**10, 2**14, 2**18, 2**20, 2**22)
"""Message sizes of the end-of-session all-reduce microbenchmark besides the model's bucket
sizes: 1 KiB (latency) to 4 MiB (bandwidth), enough points for ``estimate --fit``."""
LOCK_WAIT_S = 60.0
"""How long rank 0 waits for another writer of the same folder before it gives up."""
SOURCE = "attach"
"""The ``config_json`` mark of a run recorded by :func:`attach` (a sweep's cells have none)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AttachConfig:
    """What :func:`attach` records and where it writes; checked before anything runs."""

    out: Path
    """The dataset folder (rank 0 writes it; created if missing)."""
    profile_steps: range | None = None
    """Steps traced by the profiler (consecutive, e.g. ``range(2, 5)``); None: no profiler."""
    warmup_steps: int = 1
    """Steps not measured at the start; step 0 never is (one bucket, before DDP's rebuild)."""
    max_steps: int = DEFAULT_MAX_STEPS
    """Steps recorded at most; later ones are not timed (bounded memory in long training)."""
    microbench_iters: int = DEFAULT_MICROBENCH_ITERS
    """Timed all-reduce iterations per message size at the end; 0: no microbenchmark."""
    microbench_sizes_bytes: tuple[int, ...] = DEFAULT_MICROBENCH_SIZES_BYTES
    """Message sizes measured besides the model's bucket sizes."""
    batch_size: int | None = None
    """Per-rank batch size, for the ``cells`` row only (commprof cannot see it)."""
    name: str = SOURCE
    """The ``sweep`` column of the run's row (reports list it as the sweep)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_steps, int) or self.max_steps < 2:
            raise ValueError(f"max_steps must be an int >= 2, got {self.max_steps!r}")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.max_steps:
            raise ValueError(
                f"warmup_steps must be an int in [0, max_steps), got {self.warmup_steps!r}"
            )
        if not isinstance(self.microbench_iters, int) or self.microbench_iters < 0:
            raise ValueError(f"microbench_iters must be an int >= 0, got {self.microbench_iters!r}")
        sizes = self.microbench_sizes_bytes
        if not isinstance(sizes, tuple) or not all(isinstance(n, int) and n > 0 for n in sizes):
            raise ValueError(
                f"microbench_sizes_bytes must be a tuple of ints > 0 (bytes), got {sizes!r}"
            )
        if self.batch_size is not None and (
            not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise ValueError(f"batch_size must be None or an int >= 1, got {self.batch_size!r}")
        steps = self.profile_steps
        if steps is not None:
            if not isinstance(steps, range) or steps.step != 1 or len(steps) == 0:
                raise ValueError(
                    f"profile_steps must be a non-empty range of consecutive steps such as "
                    f"range(2, 5), got {steps!r}"
                )
            if steps.start < 0 or steps.stop > self.max_steps:
                raise ValueError(
                    f"profile_steps {steps!r} must lie within the recorded steps "
                    f"range(0, {self.max_steps}) (max_steps)"
                )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RunCell:
    """The ``cells`` description of one attached run: what :func:`commprof.results.cell_row`
    reads of a cell (``config()``, ``cell_id``, ``regime``), for a model outside the catalog."""

    settings: dict[str, Any]
    """The configuration: every identity field of a sweep cell (None where it does not apply)
    and what only an attached run has (``source``, ``profile_steps``)."""

    def config(self) -> dict[str, Any]:
        return dict(self.settings)

    @property
    def cell_id(self) -> str:
        return config_hash(self.settings)

    @property
    def regime(self) -> str:
        return regime_of(self.settings["backend"], self.settings["device"])

    def with_repeat(self, repeat: int) -> RunCell:
        return RunCell(settings={**self.settings, "repeat": repeat})


def bucket_cap_of(ddp: DistributedDataParallel) -> float | None:
    """The model's bucket cap in MiB as DDP reads ``bucket_cap_mb``; None: DDP's default.

    DDP keeps the cap in whole bytes, ``int(mb * 2**20)``; the shortest decimal that gives the
    same bytes is the value passed (0.1, not 0.09999942...).
    """
    if getattr(ddp, "bucket_bytes_cap_default", False):
        return None
    cap_bytes = int(ddp.bucket_bytes_cap)
    for digits in range(10):
        mb = round(cap_bytes / 2**20, digits)
        if int(mb * 2**20) == cap_bytes:
            return mb
    return cap_bytes / 2**20


def attach(
    ddp: DistributedDataParallel,
    out: str | os.PathLike[str] = "commprof-run",
    *,
    profile_steps: range | None = None,
    comm_hook: Hook | None = None,
    comm_state: Any = None,
    **settings: Any,
) -> Session:
    """Time the gradient communication of your own DDP training; see the module docstring.

    Args:
        ddp: the model, wrapped in ``DistributedDataParallel`` and not yet run backward, with
            no comm hook registered (pass yours here instead).
        out: the dataset folder rank 0 writes when the session ends.
        profile_steps: steps to trace with the profiler, e.g. ``range(2, 5)``; None: none.
        comm_hook: your DDP comm hook ``hook(state, bucket) -> Future``; the timing wrapper
            composes with it (default: DDP's plain all-reduce hook).
        comm_state: the state your hook expects.
        settings: further :class:`AttachConfig` fields (``warmup_steps``, ``max_steps``,
            ``microbench_iters``, ``batch_size``, ``name``).

    Returns:
        The session; use it as a context manager and call ``.step()`` after every step.
    """
    config = AttachConfig(out=Path(out), profile_steps=profile_steps, **settings)
    return Session(ddp, config, comm_hook=comm_hook, comm_state=comm_state)


class Session:
    """One attached run. Made by :func:`attach`; see the module docstring."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        config: AttachConfig,
        *,
        comm_hook: Hook | None = None,
        comm_state: Any = None,
    ) -> None:
        if not isinstance(ddp, DistributedDataParallel):
            raise TypeError(
                f"commprof.attach needs a torch.nn.parallel.DistributedDataParallel model, got "
                f"{type(ddp).__name__}; wrap your model in DistributedDataParallel first"
            )
        if not dist.is_initialized():
            raise RuntimeError("commprof.attach needs an initialised process group")
        self.config = config
        # What the cells row says of the model, taken now: the session keeps no reference to
        # the model (see __exit__).
        self.model_name = type(ddp.module).__name__
        self.num_params = sum(p.numel() for p in ddp.module.parameters())
        self.bucket_cap_mb = bucket_cap_of(ddp)
        self.group: Any = ddp.process_group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        first_param = next(ddp.module.parameters())
        self.device = first_param.device
        if self.rank == 0:
            from commprof.results import check_writable

            check_writable(config.out)  # before the first step, not after the last
        inner = comm_hook if comm_hook is not None else default_hooks.allreduce_hook
        names = {id(p): n for n, p in ddp.module.named_parameters()}
        self.state = TimingState(
            comm_state,
            param_names=names,
            module_types=module_types(ddp.module),
            use_cuda_events=first_param.is_cuda,
        )
        try:
            ddp.register_comm_hook(self.state, timing_wrapper(inner))
        except RuntimeError as err:
            raise ValueError(
                f"commprof.attach could not register its timing hook ({err}); register no comm "
                "hook yourself: pass it as commprof.attach(model, comm_hook=..., comm_state=...)"
            ) from None
        self.hook_name = getattr(inner, "__name__", type(inner).__name__)
        self.steps: list[dict[str, Any]] = []
        self.buckets: list[dict[str, Any]] = []
        self._forward_start: int | None = None
        self._forward_end: int | None = None
        self._last_end_ns = 0
        self._started = 0.0
        self._harness: ProfilerHarness | None = None
        self._trace_dir: Path | None = None
        self.cell_id: str | None = None
        """The run's cell id in the dataset, on every rank once the block has ended."""
        self._handles = [
            ddp.register_forward_pre_hook(self._on_forward_start),
            ddp.register_forward_hook(self._on_forward_end),
        ]

    # -- the hot path -------------------------------------------------------------------------

    def _on_forward_start(self, _module: Any, _inputs: Any) -> None:
        if self._forward_start is None:  # the first forward of the step (accumulation: several)
            self._forward_start = time.perf_counter_ns()

    def _on_forward_end(self, _module: Any, _inputs: Any, _output: Any) -> None:
        self._forward_end = time.perf_counter_ns()

    def step(self) -> None:
        """Mark the end of a training step (after the optimizer step)."""
        end_ns = time.perf_counter_ns()
        state = self.state
        index = state.step
        if not state.recording:
            return
        start = self._forward_start if self._forward_start is not None else self._last_end_ns
        forward_end = self._forward_end
        backward_end = state.last_done_ns(index)
        self.steps.append(
            {
                "rank": self.rank,
                "step": index,
                "measured": index >= max(1, self.config.warmup_steps),
                "start_ns": start,
                "step_ns": end_ns - start,
                "forward_ns": forward_end - start if forward_end is not None else None,
                "backward_ns": (
                    backward_end - forward_end
                    if backward_end is not None and forward_end is not None
                    else None
                ),
                "optimizer_ns": end_ns - backward_end if backward_end is not None else None,
            }
        )
        self._forward_start = self._forward_end = None
        self._last_end_ns = end_ns
        if not state.use_cuda_events:
            self._keep(state.resolve())
        elif index >= 1 and state.device_done(index - 1):
            self._keep(state.resolve(before_step=index))  # never waits for the device
        state.step = index + 1
        self._advance_profiler(index)
        if state.step >= self.config.max_steps:
            state.recording = False

    def _keep(self, rows: list[dict[str, Any]]) -> None:
        self.buckets.extend({"rank": self.rank, **row} for row in rows)

    def _advance_profiler(self, index: int) -> None:
        if self._harness is None:
            return
        self._harness.step()
        steps = self.config.profile_steps
        assert steps is not None
        if index >= steps.stop - 1:  # the range is traced and exported: profiler off
            self._harness.__exit__(None, None, None)
            self._harness = None

    # -- start and end --------------------------------------------------------------------------

    def __enter__(self) -> Session:
        self._started = time.time()
        self._last_end_ns = time.perf_counter_ns()
        steps = self.config.profile_steps
        if steps is not None:
            self._trace_dir = Path(tempfile.mkdtemp(prefix=f"commprof-attach-r{self.rank}-"))
            # One step of the profiler's own warm-up (traced, discarded) before the range where
            # there is one: the trace holds exactly the steps asked for.
            warmup = 1 if steps.start >= 1 else 0
            harness_config = HarnessConfig(
                rank=self.rank,
                wait=steps.start - warmup,
                warmup=warmup,
                active=len(steps),
                repeat=1,
            )
            self._harness = ProfilerHarness(self._trace_dir, harness_config).__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.state.recording = False
        for handle in self._handles:
            handle.remove()
        if self._harness is not None:
            self._harness.__exit__(kind, err, tb)
            self._harness = None
        if kind is not None:  # no collective: a peer may be gone; nothing is written
            if self._trace_dir is not None:
                shutil.rmtree(self._trace_dir, ignore_errors=True)
            return
        self._finish()
        # Keep no reference to the process group past the block: gloo's worker threads hold
        # work with tensors in it, and where its last reference goes only at interpreter exit,
        # releasing them there aborts the process ("terminate called without an active
        # exception"; docs/design.md, Measured facts). The user's DDP model holds the group too.
        self.group = None
        gc.collect()

    def _finish(self) -> None:
        """Gather every rank's records on rank 0, commit them, share the outcome."""
        from commprof.training.launcher import fingerprint

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # sync point: after the last step, once
        self._keep(self.state.resolve())
        records: dict[str, list[dict[str, Any]]] = {"steps": self.steps, "buckets": self.buckets}
        traces: dict[str, bytes] = {}
        if self._trace_dir is not None:
            from commprof.training.trainer import trace_records

            records["trace_metrics"], traces = trace_records(self._trace_dir, self.buckets)
        if self.rank == 0:
            records["bucket_params"] = [dataclasses.asdict(p) for p in self.state.composition]
            records["microbench"] = []
        microbench = self._microbench()
        if self.rank == 0:
            records["microbench"] = microbench
        mine = {
            "records": records,
            "traces": traces,
            "env": fingerprint(self.device),
            "node": platform.node(),
            "wall_s": time.time() - self._started,
        }
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        root = dist.get_global_rank(self.group, 0)
        dist.gather_object(mine, gathered, dst=root, group=self.group)
        outcome: list[Any] = [self._commit(gathered) if gathered is not None else None]
        dist.broadcast_object_list(outcome, src=root, group=self.group)  # rank 0 has written
        error, self.cell_id = outcome[0]
        if error is not None:
            raise RuntimeError(f"commprof.attach: rank 0 could not write the dataset: {error}")
        if self.rank == 0:
            print(self._written_line(), flush=True)

    def _written_line(self) -> str:
        """What rank 0 prints once the folder is written: the folder, the cell, what reads it."""
        from commprof.caps import cap_label

        out = self.config.out
        return (
            f"commprof.attach: wrote cell {self.cell_id} ({self.model_name}, {self.world_size} "
            f"ranks, bucket cap {cap_label(self.bucket_cap_mb)}, {len(self.steps)} steps) to "
            f"{out}/; read it with `commprof report {out}`"
        )

    def _microbench(self) -> list[dict[str, Any]]:
        """The all-reduce microbenchmark over the configured sizes and the model's bucket sizes
        (every rank takes part; the same decision everywhere, the sizes being the model's)."""
        from commprof.training.microbench import MicrobenchConfig, run_allreduce_bench

        buckets = sorted({int(r["num_bytes"]) for r in self.buckets if r["step"] >= 1})
        if not self.config.microbench_iters or self.world_size != dist.get_world_size():
            return []  # the microbenchmark runs on the default group only
        rows: list[dict[str, Any]] = []
        for source, sizes in (("sizes", self.config.microbench_sizes_bytes), ("bucket", buckets)):
            if not sizes:
                continue
            config = MicrobenchConfig(
                sizes_bytes=tuple(sizes), timed_iters=self.config.microbench_iters
            )
            results = run_allreduce_bench(
                config, rank=self.rank, world_size=self.world_size, device=self.device
            )
            rows.extend({**row, "source": source} for row in results)
        return rows

    def _commit(self, per_rank: list[dict[str, Any]]) -> tuple[str | None, str | None]:
        """Rank 0: commit the run under the folder's lock; (error text or None, cell id)."""
        from commprof import results
        from commprof.lock import DatasetLock

        try:
            with DatasetLock(self.config.out, wait_s=LOCK_WAIT_S):
                taken = results.latest_status(self.config.out)
                cell = self._cell()
                while cell.cell_id in taken:
                    cell = cell.with_repeat(cell.settings["repeat"] + 1)
                results.commit_attempt(
                    self.config.out,
                    cell,
                    per_rank=per_rank,
                    sweep=self.config.name,
                    attempt=1,
                    num_params=self.num_params,
                    nodes=sorted({str(r["node"]) for r in per_rank}),
                    started_unix_s=self._started,
                    wall_s=time.time() - self._started,
                )
        except Exception as err:  # every rank must learn it, or the others wait forever
            return f"{type(err).__name__}: {err}", None
        return None, cell.cell_id

    def _cell(self) -> RunCell:
        """This run's configuration, in the identity fields of a sweep cell."""
        steps = self.config.profile_steps
        settings: dict[str, Any] = {name: None for name in ID_FIELDS}
        settings.update(
            model=self.model_name,
            world_size=self.world_size,
            bucket_cap_mb=self.bucket_cap_mb,
            backend=str(dist.get_backend(self.group)),
            device=self.device.type,
            hook=self.hook_name,
            steps=len(self.steps),
            warmup_steps=self.config.warmup_steps,
            batch_size=self.config.batch_size,
            repeat=0,
            microbench_sizes_bytes=list(self.config.microbench_sizes_bytes),
            microbench_iters=self.config.microbench_iters,
            microbench_passes=1,
            hook_cost_pairs=0,  # the user's loop is not commprof's to repeat without the hook
            profile=steps is not None,
            source=SOURCE,
            profile_steps=[steps.start, steps.stop - 1] if steps is not None else None,
            num_params=self.num_params,
        )
        json.dumps(settings)  # plain values only: it is hashed and stored as JSON
        return RunCell(settings=settings)
