"""Which Ray cluster to attach to: the one rule for the driver, ``commprof check`` and
``commprof analyze --ray``.

An address the user gave (a flag, ``RAY_ADDRESS``) or the cluster that ``ray start`` recorded
on this machine, if it still answers; never another process's embedded Ray, which Ray's own
``address="auto"`` also finds by scanning processes and which vanishes when that process exits.
No module-level ray import: this module is read by torch- and ray-free commands.
"""

from __future__ import annotations

import os
import socket
from typing import Any

PROBE_TIMEOUT_S = 2.0
"""How long one TCP probe of a GCS may take (a refused connection answers at once)."""


def recorded_address() -> str | None:
    """The address ``ray start`` recorded on this machine, if any.

    ``ray start --head`` writes it to ``<ray temp dir>/ray_current_cluster`` (``ray stop``
    removes it); ``ray.init()`` of an embedded Ray does not, so another driver's embedded Ray is
    never found here. ``ray.cluster_utils.Cluster`` (tests) writes it too.
    """
    from commprof.extras import require

    utils = require("ray._private.utils", needed_by="connecting to a Ray cluster")
    return utils.read_ray_address() or None  # what ray.init() itself reads


def reachable(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds (the GCS listens there)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def cluster_address(explicit: str | None = None) -> str | None:
    """The cluster to attach to, or None where the caller should start its own Ray.

    Args:
        explicit: an address from the command line; wins over everything.

    Returns:
        ``explicit``, else ``RAY_ADDRESS``, else (also for ``auto``) the address ``ray start``
        recorded if its GCS answers; None otherwise (start an embedded Ray:
        ``ray.init(address="local")``).
    """
    address = explicit or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":  # Ray's "auto" also scans for other processes' Rays
        return address
    recorded = recorded_address()
    return recorded if recorded is not None and reachable(recorded) else None


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for its single-machine mode (its default on Windows and macOS): at ``0`` a new
node takes 127.0.0.1 as its address (``ray._private.services.get_node_ip_address``), and its
GCS, raylet, workers, agents and metrics endpoints listen there only."""


def init_local(**kwargs: Any) -> Any:
    """Start an embedded Ray of this process, reachable from this machine only.

    Ray binds a node's servers to the node's address, which on Linux is the machine's outside
    address (the GCS, raylet and workers on every interface, the metrics endpoints too). An
    embedded Ray serves one driver on one machine, so it is started in Ray's single-machine mode
    (:data:`LOOPBACK_ENV` at 0): its node address is 127.0.0.1 and everything it starts inherits
    that. ``ray start`` clusters are not touched (they are Ray's own, started by the user).

    Args:
        kwargs: further ``ray.init`` arguments (``address`` is ``"local"``).

    Returns:
        What ``ray.init`` returns.
    """
    from commprof.extras import require

    ray = require("ray", needed_by="an embedded Ray")
    constants: Any = require("ray._private.ray_constants", needed_by="an embedded Ray")
    saved_env, saved = os.environ.get(LOOPBACK_ENV), constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"  # for the GCS, raylet and workers it starts (inherited)
    constants.ENABLE_RAY_CLUSTER = False  # this process read the variable at import
    try:
        context = ray.init(address="local", **kwargs)
        from commprof.ray_reaper import start_reaper

        start_reaper()  # the raylet's agents end with this process, not 90 s later
        return context
    finally:
        constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = saved_env
