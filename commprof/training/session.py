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

How the ranks' rows reach the dataset: when the block ends, the ranks first agree through the
process group's store, without a collective, that they all made the same number of
``run.step()`` calls and handed their comm hooks the same number of buckets
(:mod:`commprof.training.agreement`); ranks that disagree (one ran more steps, one calls
``run.step()`` every other iteration) raise :class:`~commprof.training.agreement.RanksDisagree`
naming the ranks and their counts within a second or so, instead of waiting in mismatched
collectives until the process group's timeout. A run that recorded no measured step raises
``ValueError``. Then every rank resolves its records, derives its trace metrics, runs the short
all-reduce microbenchmark over the model's bucket sizes (what ``estimate --fit`` fits;
``microbench_iters=0`` skips it), and one ``gather_object`` on the DDP model's process group
brings every rank's records to its rank 0, which commits them under the folder's lock
(``commprof.lock``, waiting up to ``wait_lock`` seconds for another writer) and tells the others
the outcome through the store: every rank returns from the block after the commit, or raises
:class:`RunNotCommitted`. Where the folder cannot take the run (still in use after
``wait_lock``, a full disk), rank 0 keeps the rows in a side folder beside it (a dataset folder
of its own) and every rank's error names it: no run is lost. All of it runs after the last
step, outside the hot path. A block left by an exception writes nothing and starts no
collective (a peer may be gone); it tells the other ranks, which then raise at their end.

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
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.constants import default_pg_timeout
from torch.nn.parallel import DistributedDataParallel

from commprof.matrix import ID_FIELDS, config_hash, regime_of
from commprof.profiling.comm_hooks import Hook, TimingState, module_types, timing_wrapper
from commprof.profiling.harness import HarnessConfig, ProfilerHarness
from commprof.training.agreement import Board, Counts, RanksDisagree

DEFAULT_MAX_STEPS = 1000
"""Steps whose rows a session keeps by default; later steps run with the hook passing through."""
DEFAULT_MICROBENCH_ITERS = 5
"""Timed all-reduce iterations per message size at the end of a session."""
DEFAULT_MICROBENCH_SIZES_BYTES = (2**10, 2**14, 2**18, 2**20, 2**22)
"""Message sizes of the end-of-session all-reduce microbenchmark besides the model's bucket
sizes: 1 KiB (latency) to 4 MiB (bandwidth), enough points for ``estimate --fit``."""
LOCK_WAIT_S = 60.0
"""How long rank 0 waits by default for another writer of the same folder (``wait_lock``)
before it keeps the run in a side folder."""
END_WAIT_S = default_pg_timeout.total_seconds()
"""How long a rank that ended its block waits for the others to end theirs (they may do their
own work inside the block): the process group's default timeout, 30 minutes. A rank that went
past the others' end, or died, is found within seconds instead."""


class RunNotCommitted(RuntimeError):
    """Rank 0 could not commit the run into its folder; the message says why and where the
    run's rows are kept instead (``side``, None where even that failed)."""

    def __init__(self, message: str, side: str | None) -> None:
        super().__init__(message)
        self.side = side


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
    wait_lock: float = LOCK_WAIT_S
    """Seconds rank 0 waits for another writer of ``out`` (a sweep on the same folder) before it
    keeps the run in a side folder instead; 0: do not wait."""

    def __post_init__(self) -> None:
        wait = self.wait_lock
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait < 1e7:
            raise ValueError(f"wait_lock must be seconds in [0, 1e7), got {wait!r}")
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
        self.num_step_calls = 0
        """``step()`` calls, recorded or not (the ranks compare them at the end)."""
        self.board: Board | None = None
        if self.world_size > 1:
            self.board = Board(
                _group_store(self.group),
                rank=self.rank,
                world_size=self.world_size,
                counts=self._counts,
            )
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
        self.num_step_calls += 1
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

    def _counts(self) -> Counts:
        return Counts(steps=self.num_step_calls, buckets=self.state.num_buckets)

    # -- start and end --------------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self.board is not None:
            self.board.start()
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
        try:
            if kind is not None:  # no collective: a peer may be gone; nothing is written
                if self._trace_dir is not None:
                    shutil.rmtree(self._trace_dir, ignore_errors=True)
                if self.board is not None:
                    cause = self.board.abandon(f"{kind.__name__}: {str(err)[:200]}")
                    if cause is not None:  # a peer's doing: say what, not only the symptom
                        raise RanksDisagree(f"commprof.attach: {cause}") from err
                return
            self._finish()
        finally:
            if self.board is not None:
                self.board.stop()
            # Keep no reference to the process group past the block: gloo's worker threads hold
            # work with tensors in it, and where its last reference goes only at interpreter
            # exit, releasing them there aborts the process ("terminate called without an active
            # exception"; docs/design.md, Measured facts). The user's DDP model holds it too.
            self.group = None
            gc.collect()

    def _finish(self) -> None:
        """Agree on the end, gather every rank's records on rank 0, commit them, share the
        outcome."""
        from commprof.training.launcher import fingerprint

        if self.board is not None:  # before any collective: ranks that disagree would hang in it
            self.board.agree(self._counts(), wait_s=END_WAIT_S)
        measured = [row for row in self.steps if row["measured"]]
        if not measured:  # the same on every rank, which agree on their step() calls
            raise ValueError(
                f"commprof.attach: the run recorded {len(self.steps)} step(s) and none measured "
                f"(step 0 and the first warmup_steps={self.config.warmup_steps} are not); call "
                "run.step() at the end of every training step, inside the block, and train at "
                "least two steps"
            )
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
        if gathered is not None:
            outcome = self._commit(gathered)
            if self.board is not None:
                self.board.post_outcome(outcome)
        else:  # through the store, not a collective: rank 0 may wait for the lock for long
            assert self.board is not None
            outcome = self.board.outcome(source=0)
        self.cell_id = outcome["cell_id"]
        if outcome["error"] is not None:
            raise RunNotCommitted(f"commprof.attach: {outcome['error']}", outcome.get("side"))
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

    def _commit(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Rank 0: commit the run under the folder's lock, else keep it in a side folder.

        Returns:
            The outcome every rank learns: ``error`` (None: committed), ``cell_id``, ``side``
            (the side folder that holds the run, where it is not in ``out``).
        """
        from commprof import results
        from commprof.lock import DatasetLock

        out = self.config.out
        fields = {
            "per_rank": per_rank,
            "sweep": self.config.name,
            "attempt": 1,
            "num_params": self.num_params,
            "nodes": sorted({str(r["node"]) for r in per_rank}),
            "started_unix_s": self._started,
        }
        cell = self._cell()
        hint = "pass commprof.attach(..., wait_lock=SECONDS) to wait longer, or another out="
        try:
            lock = DatasetLock(out, wait_s=self.config.wait_lock, hint=hint)
            with lock, lock.writing():
                taken = results.latest_status(out)
                while cell.cell_id in taken:
                    cell = cell.with_repeat(cell.settings["repeat"] + 1)
                results.commit_attempt(out, cell, wall_s=time.time() - self._started, **fields)
            return {"error": None, "cell_id": cell.cell_id}
        except Exception as err:  # every rank must learn it, or the others wait forever
            reason = f"{type(err).__name__}: {err}"
        cell = self._cell()  # repeat 0 in a folder of its own
        try:
            side = _keep_aside(
                out,
                lambda folder: results.commit_attempt(
                    folder, cell, wall_s=time.time() - self._started, **fields
                ),
            )
        except Exception as err:
            return {
                "error": f"{out} did not take the run ({reason}), and keeping it in a side "
                f"folder failed too ({type(err).__name__}: {err}): its rows are lost",
                "cell_id": None,
            }
        return {
            "error": f"{out} did not take the run ({reason}); its rows are kept in {side}, a "
            "dataset folder of its own (commprof report, analyze and estimate --fit read it)",
            "cell_id": cell.cell_id,
            "side": str(side),
        }

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


def _group_store(group: Any) -> Any:
    """The key-value store the ranks of ``group`` met through (no collective reaches it)."""
    get = getattr(group, "get_group_store", None)
    if get is not None:
        return get()
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()  # torch before ProcessGroup.get_group_store


def _keep_aside(out: Path, commit: Callable[[Path], Any]) -> Path:
    """Commit a run that ``out`` did not take into a new folder beside it, else (a full or
    read-only filesystem) in the temporary folder; returns the folder that holds it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix = f"{out.name or 'commprof-run'}.unsaved-{stamp}-"
    errors = []
    for parent in (out.resolve().parent, Path(tempfile.gettempdir())):
        side: Path | None = None
        try:
            side = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            commit(side)
            return side
        except (OSError, RuntimeError) as err:  # CommitFailed is a RuntimeError
            errors.append(f"{side or parent}: {err}")
            if side is not None:
                shutil.rmtree(side, ignore_errors=True)
    raise OSError("; ".join(errors))
