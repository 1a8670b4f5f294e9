"""The Ray actor that is one rank of a gang: it joins a process group per cell and trains.

An actor outlives cells: the driver reuses a gang of them for the next cell of the same shape,
which saves the process start and ``import torch`` (about 2 s a cell; docs/design.md, Measured
facts). Each cell gets a new TCPStore from rank 0 and a fresh process group, destroyed after a
barrier.

What torch.distributed needs inside Ray actors, as torchrun would give it (docs/design.md, GPUs on
Ray):

- Devices: GPU rank actors start with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` (their
  ``runtime_env``, :func:`commprof.actors.gang.rank_env`), so Ray does not mask the node's GPUs
  per actor (the masking slowed NCCL all-reduce by orders of magnitude on NVSwitch systems and
  broke NVLS, ray-project/ray issue 61073); each rank then takes the GPU Ray assigned it,
  ``torch.cuda.set_device(id)`` with the id from ``get_accelerator_ids()``.
- Rendezvous: the store lives on rank 0's node (its address, not the driver's) and rank 0 binds
  it to port 0 itself (:meth:`RankActor.open_store`), so no port is probed and bound later by
  another process in between.
- Environment: NCCL, gloo and PyTorch variables reach the ranks through the actors'
  ``runtime_env``, never the driver's environment; ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` and the
  matrix's short process-group timeout make a rank whose peer died fail within that timeout
  instead of the NCCL watchdog's 10 to 30 minutes.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import ray

from commprof.outcomes import inject_fault

LOOPBACK = "127.0.0.1"
"""Where the ranks of a gang on one node meet (``actors.execution``): the store listens there
only."""

SHOWN_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "RAY_EXPERIMENTAL_NOSET_")
"""The variables :meth:`RankActor.describe` reports."""


class RankActor:
    """One rank. Created by :class:`commprof.actors.gang.Gang` inside a placement-group bundle."""

    def __init__(self, num_threads: int = 1) -> None:
        import torch

        # Import the trainer now: gang start-up pays it, not the gang's first cell.
        import commprof.training.trainer  # noqa: F401

        torch.set_num_threads(num_threads)
        self._ctx = ray.get_runtime_context()
        self._store: Any = None
        # A GLOO_SOCKET_IFNAME from the matrix's env section wins over the loopback default.
        self._gloo_ifname = os.environ.get("GLOO_SOCKET_IFNAME")

    def node(self) -> tuple[str, str]:
        """(Ray node id, node IP address) of this actor."""
        return self._ctx.get_node_id(), ray.util.get_node_ip_address()

    def gpu_index(self) -> int | None:
        """The CUDA device index of the GPU Ray assigned this actor (None: no GPU).

        With ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`` every GPU of the node is visible,
        so Ray's id is the device index on the node, as torchrun's local rank is.
        """
        ids = self._ctx.get_accelerator_ids().get("GPU", [])
        return int(ids[0]) if ids else None

    def describe(self) -> dict[str, Any]:
        """What this rank sees: node, assigned GPUs, the device it will use, its environment."""
        return {
            "node": self.node(),
            "gpu_ids": list(self._ctx.get_accelerator_ids().get("GPU", [])),
            "device_index": self.gpu_index(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "env": {k: v for k, v in os.environ.items() if k.startswith(SHOWN_ENV_PREFIXES)},
        }

    def open_store(self, host: str, world_size: int, timeout_s: float) -> int:
        """Rank 0: start the cell's TCPStore on a port the OS picks now, keep it, return it.

        Binding port 0 in the process that keeps the socket leaves no gap in which another
        process could take the port (a probe, close and later bind would).
        """
        import torch.distributed as dist

        port, listen_fd = 0, None
        if host == LOOPBACK:  # a gang on one node: the store answers on loopback only (a
            # TCPStore binds every interface itself; it takes a socket bound here instead)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                sock.listen(128)
                port, listen_fd = sock.getsockname()[1], sock.detach()  # the store closes it
        try:
            self._store = dist.TCPStore(
                host,
                port,
                world_size=world_size,
                is_master=True,
                timeout=_timedelta(timeout_s),
                wait_for_workers=False,
                master_listen_fd=listen_fd,
            )
        except BaseException:
            if listen_fd is not None:
                os.close(listen_fd)
            raise
        return int(self._store.port)

    def run(
        self,
        config: dict[str, Any],
        *,
        rank: int,
        local_rank: int,
        master_addr: str,
        master_port: int,
        timeout_s: float,
        loopback: bool,
        fault: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run one rank of a cell and return its records and environment fingerprint.

        Args:
            config: ``Cell.config()`` of the cell.
            rank: this rank.
            local_rank: this rank's index among the gang's ranks on its node.
            master_addr: rank 0's node address (loopback on one node) for the TCPStore.
            master_port: the port of the store rank 0 opened (:meth:`open_store`).
            timeout_s: the process-group timeout.
            loopback: all ranks on one node: gloo talks over ``lo`` (docs/design.md, Measured
                facts).
            fault: test-only fault injection, ``{"rank": R, "kind": "raise" | "hang"}``: rank R
                raises (a RuntimeError, or the builtin named by ``fault["error"]``), or stops
                taking part, before it joins the group.
        """
        import torch.distributed as dist

        from commprof.matrix import cell_from_config
        from commprof.training.launcher import run_rank

        if self._gloo_ifname is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = self._gloo_ifname
        elif loopback:
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        else:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        cell = cell_from_config(config)
        store, self._store = self._store, None  # rank 0's, opened for this cell
        if fault is not None and fault.get("rank") == rank:
            inject_fault(fault)
        started = time.time()
        if rank == 0 and store is None:
            raise RuntimeError("rank 0 runs a cell without its store; call open_store first")
        if rank != 0:
            store = dist.TCPStore(
                master_addr,
                master_port,
                world_size=cell.world_size,
                is_master=False,
                timeout=_timedelta(timeout_s),
            )
        result = run_rank(
            cell,
            rank=rank,
            local_rank=local_rank,
            store=store,
            timeout_s=timeout_s,
            device_index=self.gpu_index() if cell.device == "cuda" else None,
        )
        result["wall_s"] = time.time() - started
        return result


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)
