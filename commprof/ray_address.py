"""Which Ray cluster to attach to: the one rule for the driver, ``commprof check`` and
``commprof analyze --ray``.

An address the user gave (a flag, ``RAY_ADDRESS``) or the cluster that ``ray start`` recorded
on this machine, if it still answers; never another process's embedded Ray, which Ray's own
``address="auto"`` also finds by scanning processes and which vanishes when that process exits.
No module-level ray import: this module is read by torch- and ray-free commands.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

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


AUTH_MODE_ENV = "RAY_AUTH_MODE"
"""Ray's token-authentication switch (``token`` or ``disabled``), read by every Ray process."""
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
"""Where Ray reads a cluster's token, before its default file ``~/.ray/auth_token``."""

Answer = Literal["answers", "needs a token", "unreachable"]


def token_source() -> str | None:
    """Where Ray would read a cluster token on this machine, or None where there is none.

    Ray's order: ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``
    (which ``ray start --head``, ``ray get-auth-token --generate`` and a new embedded Ray write).
    """
    if os.environ.get(TOKEN_ENV, "").strip():
        return TOKEN_ENV
    named = os.environ.get(TOKEN_PATH_ENV)
    path = Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"
    return str(path) if path.is_file() and path.read_text().strip() else None


def use_token_auth() -> bool:
    """Turn Ray's token authentication on for this process's next ``ray.init(address=...)``
    where ``RAY_AUTH_MODE`` is unset and a token is at hand; whether it is on.

    What Ray itself does for ``ray.init()`` of a cluster it finds on this machine, but not for an
    address given by argument or ``RAY_ADDRESS`` (Ray 2.60): without it a driver that holds the
    token still fails with ``InvalidAuthToken``. A ``RAY_AUTH_MODE`` the user set is kept. Only
    for a cluster that asks for a token (:func:`negotiate`): a driver with token authentication
    on refuses its cluster's calls where the cluster has none, and the cluster then takes the
    driver for dead and destroys its actors.
    """
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None:
        return mode.strip().lower() == "token"
    if token_source() is None:
        return False
    os.environ[AUTH_MODE_ENV] = "token"  # inherited by what this process starts
    from commprof.extras import require

    raylet: Any = require("ray._raylet", needed_by="connecting to a Ray cluster")
    raylet.Config.initialize("")  # this process read the variable at import (as Ray's own does)
    return True


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Ray's C++ client logs each failed handshake to file descriptor 2; the caller says it
    once, in words, instead."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def probe(address: str) -> Answer:
    """Whether the GCS at ``address`` answers this process, refuses it for want of a token, or
    cannot be reached; within about :data:`PROBE_TIMEOUT_S` (``ray.init`` retries for 20 to
    40 s before it says either).

    Probes as this process would connect now (:func:`negotiate` turns token authentication on
    where the cluster asks for it).
    """
    if not reachable(address):
        return "unreachable"
    if os.environ.get(AUTH_MODE_ENV, "").strip().lower() == "token" and token_source() is None:
        return "needs a token"  # Ray's client would end this process (exit 1, no message)
    from commprof.extras import require

    raylet: Any = require("ray._raylet", needed_by="connecting to a Ray cluster")
    exceptions: Any = require("ray.exceptions", needed_by="connecting to a Ray cluster")
    try:
        with _quiet_stderr():
            raylet.GcsClient(address=address)  # one handshake: token checked, cluster id read
    except exceptions.AuthenticationError:
        return "needs a token"
    except (exceptions.RpcError, ConnectionError, OSError):
        return "unreachable"
    return "answers"


def negotiate(address: str) -> Answer:
    """Probe the GCS at ``address`` and make this process connect to it as it asks: token
    authentication turned on (:func:`use_token_auth`) only where the cluster refuses a driver
    without a token and one is at hand; a ``RAY_AUTH_MODE`` the user set stands as set.

    Returns:
        What the last probe found (:func:`probe`).
    """
    answer = probe(address)
    if answer == "needs a token" and AUTH_MODE_ENV not in os.environ and use_token_auth():
        answer = probe(address)
    return answer


def attach(address: str) -> None:
    """Make ready to ``ray.init(address=address)``: token authentication as the cluster asks
    (:func:`negotiate`), and a one-line error before Ray's own retries where the cluster cannot
    be used.

    Raises:
        ConnectionError: nothing answers at ``address``, or it wants a token this machine lacks;
            the message says what to set.
    """
    answer = negotiate(address)
    if answer == "needs a token":
        raise ConnectionError(f"Ray cluster {address}: {NEEDS_TOKEN}")
    if answer == "unreachable":
        raise ConnectionError(
            f"no Ray cluster answers at {address} (from --address or RAY_ADDRESS): start it "
            "with `ray start --head`, or unset RAY_ADDRESS to run on an embedded Ray"
        )


NEEDS_TOKEN = (
    "reachable, needs a token: copy the head's ~/.ray/auth_token to this machine's "
    "~/.ray/auth_token (or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
)
"""What to do about a cluster that refuses a driver without its token (one line)."""


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
