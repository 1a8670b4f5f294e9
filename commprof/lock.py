"""One owner per dataset folder: a lock file that works across the nodes of a shared filesystem.

``DIR/.commprof.lock`` is created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and on
NFS v3 and later) and holds who owns the folder: host, pid, start time and a random token. The
owner refreshes the file's modification time every ``HEARTBEAT_S`` seconds from a background
thread. A lock is stale, and is taken over, when its owner is a process of this host that no
longer exists, or when its heartbeat is older than ``STALE_S`` (an owner on another node that
crashed). Taking over renames the stale file away first, so two drivers that both find it stale
cannot both win: only one rename succeeds.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

LOCK_NAME = ".commprof.lock"
"""The lock file's name inside the dataset folder."""
HEARTBEAT_S = 5.0
"""How often the owner refreshes the lock file."""
STALE_S = 60.0
"""A lock whose heartbeat is older than this belongs to an owner that is gone."""
RETRY_S = 0.5
"""How often a waiting driver looks again."""


class DatasetLocked(RuntimeError):
    """The dataset folder belongs to another driver; the message says which and what to do."""


class DatasetLock:
    """Own a dataset folder for the duration of a ``with`` block.

    Args:
        root: the dataset folder (created if missing).
        wait_s: how long to wait for another owner to finish; 0 fails at once.
    """

    def __init__(self, root: str | Path, *, wait_s: float = 0.0) -> None:
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self.wait_s = wait_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> DatasetLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, waiting up to ``wait_s`` for its owner.

        Raises:
            DatasetLocked: another live driver holds it (the message names it).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        while True:
            if self._try_create():
                self._beat = threading.Thread(target=self._heartbeat, daemon=True)
                self._beat.start()
                return
            holder = self._holder()
            if holder is not None and self._stale(holder):
                self._take_over(holder)
                continue
            if time.monotonic() >= deadline:
                raise DatasetLocked(self._describe(holder))
            time.sleep(RETRY_S)

    def release(self) -> None:
        """Give the lock back (only if it is still ours)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=HEARTBEAT_S)
            self._beat = None
        holder = self._holder()
        if holder is not None and holder.get("token") == self.token:
            self.path.unlink(missing_ok=True)

    def _try_create(self) -> bool:
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_unix_s": time.time(),
            "token": self.token,
        }
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _holder(self) -> dict[str, Any] | None:
        """The lock file's record (with its age), or None where there is no lock file."""
        try:
            text, age = self.path.read_text(), time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            record = json.loads(text)
        except json.JSONDecodeError:  # being written this instant, or damaged: age decides
            record = {}
        return {**(record if isinstance(record, dict) else {}), "age_s": age}

    def _stale(self, holder: dict[str, Any]) -> bool:
        if holder["age_s"] > STALE_S:
            return True
        if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            try:
                os.kill(holder["pid"], 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # alive, another user's
                return False
        return False

    def _take_over(self, holder: dict[str, Any]) -> None:
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, aside)  # one of several drivers that found it stale wins
        except FileNotFoundError:
            return
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            holder = self._holder()
            if holder is None or holder.get("token") != self.token:
                return  # taken over (we were presumed dead): stop touching someone else's lock
            os.utime(self.path)

    def _describe(self, holder: dict[str, Any] | None) -> str:
        if holder is None:
            return f"{self.root} is in use by another driver (its lock came and went); run again"
        since = holder.get("started_unix_s")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
        return (
            f"{self.root} is in use by another driver: pid {holder.get('pid', '?')} on host "
            f"{holder.get('host', '?')}, since {when} (lock file {self.path}, refreshed "
            f"{holder['age_s']:.0f} s ago). Wait for it to finish, pass --wait-lock SECONDS to "
            "wait here, or use another --out."
        )
