"""The Ray actor that is one rank of a gang: it joins a process group per cell and trains.

An actor outlives cells: the driver reuses a gang of them for the next cell of the same shape,
which saves the process start and ``import torch`` (about 2 s a cell; docs/design.md, Measured
facts). Each cell gets a new TCPStore port from rank 0 and a fresh process group, destroyed after
a barrier.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import ray


class RankActor:
    """One rank. Created by :class:`commprof.actors.gang.Gang` inside a placement-group bundle."""

    def __init__(self, num_threads: int = 1) -> None:
        import torch

        # Import the trainer now: gang start-up pays it, not the gang's first cell.
        import commprof.training.trainer  # noqa: F401

        torch.set_num_threads(num_threads)
        self._ctx = ray.get_runtime_context()

    def node(self) -> tuple[str, str]:
        """(Ray node id, node IP address) of this actor."""
        return self._ctx.get_node_id(), ray.util.get_node_ip_address()

    def free_port(self, host: str) -> int:
        """A TCP port free on this host now, for the cell's TCPStore (rank 0 asks)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])

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
            master_addr: rank 0's address for the TCPStore.
            master_port: the port rank 0 picked.
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

        if loopback:
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        else:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        cell = cell_from_config(config)
        if fault is not None and fault.get("rank") == rank:
            _inject(fault)
        started = time.time()
        store = dist.TCPStore(
            master_addr,
            master_port,
            world_size=cell.world_size,
            is_master=rank == 0,
            timeout=_timedelta(timeout_s),
            wait_for_workers=False,
        )
        result = run_rank(cell, rank=rank, local_rank=local_rank, store=store, timeout_s=timeout_s)
        result["wall_s"] = time.time() - started
        return result


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def _inject(fault: dict[str, Any]) -> None:
    """Test-only faults: what a crashing or a stuck rank looks like to the driver."""
    if fault["kind"] == "hang":
        while True:
            time.sleep(3600)
    if fault["kind"] == "raise":
        error = {"RuntimeError": RuntimeError, "ValueError": ValueError}[
            fault.get("error", "RuntimeError")
        ]
        raise error(f"injected fault: {fault}")
    raise ValueError(f"unknown fault kind {fault['kind']!r}; use raise or hang")
