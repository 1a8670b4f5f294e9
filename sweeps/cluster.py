"""Noticing that the driver's Ray cluster is gone (which cluster it attaches to:
``commprof.ray_address``).

Losing the cluster: when the GCS dies (``ray stop``, a lost head node) every control-plane call
blocks, and Ray ends the process after its reconnect timeout (60 s). A :class:`ClusterWatch`
thread probes the GCS port instead; the loop asks it before each pass and before committing a
failure, so a lost cluster stops the sweep with an error and nothing recorded for that reason.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from commprof.ray_address import reachable

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0
"""How often the watch connects to the GCS port."""
LOST_AFTER = 3
"""Failed probes in a row after which the cluster counts as lost."""
EXIT_GRACE_S = 15.0
"""After the loss, how long the driver's loop may take to stop by itself before the watch ends
the process (the loop can be stuck in a control-plane call until Ray's own 60 s limit)."""
EXIT_CLUSTER_LOST = 4
"""Exit status of a driver whose cluster was lost."""


class ClusterLost(RuntimeError):
    """The Ray cluster (its GCS) stopped answering; the message says what to do."""


class ClusterWatch:
    """Probes the GCS of the cluster the driver uses, from a daemon thread.

    Args:
        gcs_address: ``host:port`` of the GCS.
    """

    def __init__(self, gcs_address: str) -> None:
        self.gcs_address = gcs_address
        self.lost = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="commprof-cluster-watch")
        self._thread.daemon = True

    def __enter__(self) -> ClusterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()

    def check(self) -> None:
        """Raise :class:`ClusterLost` if the watch found the cluster gone."""
        if self.lost.is_set():
            raise ClusterLost(
                f"the Ray cluster at {self.gcs_address} stopped answering (its GCS is "
                "unreachable: `ray stop`, or the head node is gone). The running attempts were "
                "abandoned and nothing was recorded for them; start the cluster again and rerun "
                "the same command to resume."
            )

    def confirm(self, settle_s: float) -> None:
        """Probe now, and again for ``settle_s`` seconds; raise :class:`ClusterLost` on a miss.

        Called before a failure is committed (a rank that died with the cluster is not the
        cell's fault); ``ray stop`` kills the GCS last, seconds after the ranks.
        """
        deadline = time.monotonic() + settle_s
        while True:
            if not self.lost.is_set() and not reachable(self.gcs_address):
                self.lost.set()
            self.check()
            if time.monotonic() >= deadline:
                return
            time.sleep(PROBE_INTERVAL_S / 2)

    def _watch(self) -> None:
        failures = 0
        while not self.done.wait(PROBE_INTERVAL_S):
            failures = 0 if reachable(self.gcs_address) else failures + 1
            if failures >= LOST_AFTER:
                self.lost.set()
                break
        if self.done.wait(EXIT_GRACE_S):
            return
        # The loop is stuck in a call to the dead GCS: end the process before Ray does, with
        # the same message (committed attempts are safe: every write is atomic).
        try:
            self.check()
        except ClusterLost as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
        log.error("exiting: the driver did not stop within %.0f s of the loss", EXIT_GRACE_S)
        sys.stdout.flush()
        os._exit(EXIT_CLUSTER_LOST)
