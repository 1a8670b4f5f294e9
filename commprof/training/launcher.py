"""Process groups and local multi-process runs of a cell (``commprof run``), without Ray.

:func:`process_group` is the one way a rank joins and leaves a group, used by the local launcher
here and by the Ray rank actors alike: a short timeout always (a lost peer then fails fast
instead of hanging for 30 minutes), and a barrier before ``destroy_process_group`` (without it
about 15 % of gloo runs aborted at exit, docs/design.md, Measured facts).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from commprof.matrix import ENV_PREFIXES, Cell
from commprof.outcomes import RankFailure, inject_fault

DEFAULT_PG_TIMEOUT_S = 60.0
ERROR_GRACE_S = 5.0
"""After one rank failed, how long the others get to report before they are killed."""


@contextlib.contextmanager
def process_group(
    *,
    backend: str,
    rank: int,
    world_size: int,
    store: dist.Store,
    timeout_s: float = DEFAULT_PG_TIMEOUT_S,
) -> Iterator[None]:
    """Join a process group for the duration of the block; leave it cleanly.

    Args:
        backend: gloo or nccl.
        rank: this process's rank.
        world_size: ranks in the group.
        store: the rendezvous store (FileStore locally, TCPStore across hosts).
        timeout_s: the group's timeout for every collective.
    """
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    ok = False
    try:
        yield
        ok = True
    finally:
        if ok:
            dist.barrier()
        dist.destroy_process_group()


class ConfigError(ValueError):
    """A cell this machine cannot run as configured; running it again gives the same error."""


def device_for(cell: Cell, local_rank: int, device_index: int | None = None) -> torch.device:
    """The device a rank uses: CPU, or a CUDA device.

    Args:
        cell: the configuration.
        local_rank: the rank's index on its node; picks the device where ``device_index`` is
            None (shared when there are fewer devices than ranks, as in ``commprof run``).
        device_index: the GPU a scheduler assigned (a Ray rank actor's GPU id).
    """
    if cell.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"cell {cell.cell_id} asks for device 'cuda' but torch {torch.__version__} sees no "
            "GPU on this node; set device: cpu or run it on a GPU node"
        )
    count = torch.cuda.device_count()
    if device_index is None:
        return torch.device("cuda", local_rank % count)
    if not 0 <= device_index < count:
        raise ConfigError(
            f"the rank was assigned GPU {device_index} but sees {count} device(s); is "
            "CUDA_VISIBLE_DEVICES set where the ranks start? (commprof lets Ray leave it unset)"
        )
    return torch.device("cuda", device_index)


def fingerprint(device: torch.device) -> dict[str, Any]:
    """The environment a measurement was taken in: versions, host, device, backends."""
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "num_threads": torch.get_num_threads(),
        # read when training ended: the minute the cell ran (its own ranks included)
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        # what the collective libraries were told (a matrix's env section, NCCL_*, ...)
        "env_vars": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device_name=props.name,
            device_memory_bytes=props.total_memory,
            cuda=torch.version.cuda,
            nccl_version=".".join(map(str, torch.cuda.nccl.version())),
        )
    else:
        info["device_name"] = platform.processor() or platform.machine()
    return info


def run_rank(
    cell: Cell,
    *,
    rank: int,
    local_rank: int,
    store: dist.Store,
    timeout_s: float,
    device_index: int | None = None,
) -> dict[str, Any]:
    """One rank of a cell, start to finish: join the group, train, benchmark, leave.

    Args:
        cell: the configuration.
        rank: this rank.
        local_rank: its index on its node.
        store: the rendezvous store.
        timeout_s: the process-group timeout.
        device_index: the GPU assigned to this rank (see :func:`device_for`).

    Returns:
        ``{"records": {table: rows}, "traces": {name: gzip bytes}, "env": fingerprint}``.
    """
    from commprof.training.trainer import train_rank

    device = device_for(cell, local_rank, device_index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with process_group(
        backend=cell.backend,
        rank=rank,
        world_size=cell.world_size,
        store=store,
        timeout_s=timeout_s,
    ):
        result = train_rank(cell, rank=rank, device=device)
    return {**result, "env": fingerprint(device)}


def _spawned_rank(
    target: Callable[..., Any], rank: int, world_size: int, store_path: str, args: tuple, queue: Any
) -> None:  # pragma: no cover - runs in a child process
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    exit_code = 0
    try:
        queue.put((rank, "ok", target(rank, world_size, store_path, *args)))
    except BaseException as err:
        queue.put((rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        exit_code = 1
    # The result is in the pipe (put returns once it is written). Leave without interpreter
    # teardown: DDP keeps the gloo group and its worker threads alive past
    # destroy_process_group, and a worker thread still releasing its last work while the
    # interpreter finalizes needs the GIL and aborts the process (SIGABRT in about 2 % of
    # exits, seen as "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _cell_rank(
    rank: int,
    world_size: int,
    store_path: str,
    cell: Cell,
    timeout_s: float,
    fault: dict[str, Any] | None,
) -> dict[str, Any]:  # pragma: no cover - runs in a child process
    if fault is not None and fault.get("rank") == rank:
        inject_fault(fault)
    started = time.time()
    store = dist.FileStore(store_path, world_size)
    result = run_rank(cell, rank=rank, local_rank=rank, store=store, timeout_s=timeout_s)
    result["wall_s"] = time.time() - started
    return result


def run_local(
    cell: Cell,
    *,
    timeout_s: float = DEFAULT_PG_TIMEOUT_S,
    limit_s: float | None = None,
    fault: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run a cell on this machine: ``world_size`` spawned processes, FileStore rendezvous.

    Args:
        cell: the configuration.
        timeout_s: process-group timeout.
        limit_s: wall-clock limit of the whole run (default: 4 x timeout_s + 60 s).
        fault: test-only fault injection, ``{"rank": R, "kind": "raise" | "hang"}``
            (:func:`commprof.outcomes.inject_fault`): rank R fails before it joins the group.

    Returns:
        Per rank, in rank order, what :func:`run_rank` returns.

    Raises:
        RankFailure: with the ranks' errors grouped by text.
    """
    limit_s = limit_s if limit_s is not None else 4 * timeout_s + 60
    return spawn_ranks(_cell_rank, cell.world_size, args=(cell, timeout_s, fault), limit_s=limit_s)


def spawn_ranks(
    target: Callable[..., Any], world_size: int, *, args: tuple = (), limit_s: float = 300.0
) -> list[Any]:
    """Run ``target(rank, world_size, store_path, *args)`` in ``world_size`` fresh processes.

    The ranks rendezvous through a FileStore at ``store_path`` (in a temporary folder, removed
    afterwards) and return their results through a queue, never through files. Results must
    hold no torch tensors (convert them to numpy or lists): the queue would pass tensors by
    shared memory, which is gone once the child has exited. When a rank fails, the others get
    ``ERROR_GRACE_S`` to report before they are killed. A rank leaves with ``os._exit`` once it
    has reported, without interpreter teardown (where gloo's worker threads can abort it).

    Args:
        target: a module-level function (the children import it by name).
        world_size: number of processes.
        args: further arguments of ``target`` (picklable).
        limit_s: wall-clock limit of the whole run.

    Returns:
        The results in rank order.

    Raises:
        RankFailure: with the ranks' errors grouped by text.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}

    def drain() -> None:
        while not queue.empty():
            rank, status, payload = queue.get()
            (results if status == "ok" else errors)[rank] = payload

    with tempfile.TemporaryDirectory(prefix="commprof-store-") as tmp:
        store_path = str(Path(tmp) / "store")
        procs = [
            ctx.Process(target=_spawned_rank, args=(target, r, world_size, store_path, args, queue))
            for r in range(world_size)
        ]
        try:
            for proc in procs:
                proc.start()
        except BaseException:  # fork failed, or Ctrl-C: no child may outlive the run
            for proc in procs:
                if proc.pid is not None:
                    proc.kill()
                    proc.join(timeout=10)
            raise
        deadline = time.monotonic() + limit_s
        while len(results) + len(errors) < world_size:
            had_errors = bool(errors)
            drain()
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            drain()  # a rank may report and then die between the two looks
            for r in dead:
                if r not in results and r not in errors:
                    errors[r] = f"process exited with code {procs[r].exitcode}"
            if errors and not had_errors:  # the others fail fast or hang: a moment only
                deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
            if time.monotonic() > deadline:
                stopped = [r for r in range(world_size) if r not in results and r not in errors]
                for r in stopped:
                    errors[r] = "gave no result in time; stopped"
                    procs[r].kill()
                break
            time.sleep(0.01)
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if errors:
        raise RankFailure(errors)
    return [results[r] for r in range(world_size)]
