"""One owner per dataset folder: a lock file that works across the nodes of a shared filesystem.

``DIR/.commprof.lock`` holds who owns the folder: host, boot id, pid and the process's start
time, when it took the folder, and a random token. The owner refreshes the file's modification
time every ``HEARTBEAT_S`` seconds from a background thread.

Every look at the lock file that may change it (taking it, taking it over, the heartbeat, giving
it back, and each commit of the owner: :meth:`DatasetLock.writing`) runs under a kernel lock on
a second file, ``DIR/.commprof.lock.guard`` (``flock``: one holder on a local filesystem; on NFS
Linux maps it to a POSIX lock that the server arbitrates across nodes). So a check and the
change it decides are one step: of several drivers that find the same lock stale, the first
takes it over and the others then find the new owner's lock, live; and no one takes a lock over
while its owner commits. The guard file is never removed (a removed guard would let two
drivers hold two guards).

A lock is stale, and is taken over, only where its owner is gone:

- an owner on this host (same host name and boot id): its process no longer exists (or the pid
  now belongs to a process that started later). An owner that is alive keeps the folder however
  old its heartbeat is: stopped (SIGSTOP), swapped out, or suspended with its laptop.
- an owner on this host name with another boot id: the host rebooted since.
- an owner on another host: its heartbeat is older than ``stale_s`` (a node that crashed; no
  process table to ask).

An owner that lost the folder (it was presumed dead: another host, a heartbeat past ``stale_s``)
learns it at its next commit, which :meth:`DatasetLock.writing` refuses with :class:`LockLost`
before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

LOCK_NAME = ".commprof.lock"
"""The lock file's name inside the dataset folder."""
GUARD_NAME = ".commprof.lock.guard"
"""The file whose kernel lock makes every look-and-change of the lock file one step."""
HEARTBEAT_S = 5.0
"""How often the owner refreshes the lock file."""
STALE_S = 60.0
"""A lock of another host whose heartbeat is older than this belongs to an owner that is gone."""
RETRY_S = 0.5
"""How often a waiting driver looks again."""
GUARD_WAIT_S = 10.0
"""Longest wait for the guard, held for milliseconds at a time by a live process (longer only
where its holder is stopped in a commit: then the folder is in use)."""
GUARD_POLL_S = 0.005
"""How often a process waiting for the guard tries it again."""
WAIT_HINT = "pass --wait-lock SECONDS to wait here, or use another --out"
"""What a command-line user can do about a folder in use (``DatasetLock(hint=)`` says it for
another caller)."""
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
"""``flock`` errors of a filesystem that has no file locks."""


MAX_RECORD_BYTES = 4096
"""Most bytes of a lock file read: a record is about 200."""
_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "host": (str,),
    "boot_id": (str,),
    "pid": (int,),
    "pid_start": (int,),
    "started_unix_s": (int, float),
    "token": (str,),
}
"""The lock record's fields and the types each may have."""
MAX_PID = 1 << 22
"""Largest process id Linux gives (``pid_max``'s ceiling)."""
MAX_UNIX_S = 1e11
"""A time after this (the year 5138) is no time a lock was taken."""


def parse_record(data: bytes) -> dict[str, Any]:
    """The lock file's bytes -> its record: the one reading of a lock file.

    A damaged file (not UTF-8, not JSON, not a mapping, written by hand or by a disk error) is
    an empty record, so its age decides whether it is stale; a field of the wrong type or out
    of range (a pid past ``pid_max``, ``started_unix_s`` that is text or 1e300) is left out, so
    a damaged record is never taken for a live owner's pid or crashes a message.
    """
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(record, dict):
        return {}
    out: dict[str, Any] = {}
    for key, types in _RECORD_TYPES.items():
        value: Any = record.get(key)
        typed = isinstance(value, types) and not isinstance(value, bool)
        if not typed:  # (a flag: narrowing by a tuple of types would leave ``object``)
            continue
        if isinstance(value, str) and len(value) > 256:
            continue
        if key in ("pid", "pid_start") and not 0 < value <= (MAX_PID if key == "pid" else 1 << 62):
            continue
        if key == "started_unix_s" and not (math.isfinite(value) and 0 <= value <= MAX_UNIX_S):
            continue
        out[key] = value
    return out


class DatasetLocked(RuntimeError):
    """The dataset folder belongs to another driver; the message says which and what to do."""


class LockLost(DatasetLocked):
    """This process owned the folder, and another took it over (it presumed this one dead)."""


def boot_id() -> str | None:
    """This kernel's boot id (Linux), which changes when the host reboots; None elsewhere."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc/<pid>/stat`` field
    22); None where it does not exist or there is no ``/proc``. A pid reused by a later process
    has a later start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields after its last ')'
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22 is the 20th after the name
    except (IndexError, ValueError):
        return None


def owner_alive(pid: int, start: int | None) -> bool:
    """Whether process ``pid`` of this host exists and, where ``start`` is known, is the process
    that started then (not a later one given the same pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    if start is None:
        return True
    now = process_start(pid)
    return now is None or now == start


class DatasetLock:
    """Own a dataset folder for the duration of a ``with`` block.

    Args:
        root: the dataset folder (created if missing).
        wait_s: how long to wait for another owner to finish; 0 fails at once.
        stale_s: age of another host's heartbeat past which its lock is taken over.
        hint: what to do about a folder in use, for the message (``WAIT_HINT``).
    """

    def __init__(
        self,
        root: str | Path,
        *,
        wait_s: float = 0.0,
        stale_s: float = STALE_S,
        hint: str = WAIT_HINT,
    ) -> None:
        self.root = Path(root)
        self.hint = hint
        self.path = self.root / LOCK_NAME
        self.guard = self.root / GUARD_NAME
        self.wait_s = wait_s
        self.stale_s = stale_s
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        # One guard section at a time in this process: on NFS a POSIX lock is the process's, and
        # closing any descriptor of the guard file would release a section another thread holds.
        self._local = threading.Lock()
        self.lost_to: dict[str, Any] | None = None
        """The record of the owner that took the folder over, once the heartbeat saw it."""

    def __enter__(self) -> DatasetLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    # -- the guard ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _guarded(self, wait_s: float = GUARD_WAIT_S) -> Iterator[None]:
        """Hold the guard's kernel lock (and this process's) for the block.

        Raises:
            DatasetLocked: the guard stayed held for ``wait_s`` (its holder is stopped in a
                commit), or the filesystem has no file locks.
        """
        import fcntl  # POSIX only; imported here so that the module imports anywhere

        deadline = time.monotonic() + wait_s
        if not self._local.acquire(timeout=max(wait_s, 0.0)):
            raise DatasetLocked(f"{self.root}: this process's lock is busy past {wait_s:.0f} s")
        try:
            try:
                fd = os.open(self.guard, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                raise LockLost(
                    f"{self.root}: the dataset folder is gone (moved or removed while this "
                    "process used it); stopped before writing. Move it back and rerun to resume."
                ) from None
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise DatasetLocked(self._describe(self._holder(), busy=True)) from None
                        time.sleep(GUARD_POLL_S)
                    except OSError as err:
                        if err.errno in _NO_LOCKS:
                            raise DatasetLocked(
                                f"{self.guard}: the filesystem refuses file locks "
                                f"({err.strerror}); commprof needs them to keep one writer per "
                                "dataset folder: use a folder on a local disk or on an NFS "
                                "mount with locking"
                            ) from None
                        raise
                yield
            finally:
                os.close(fd)  # releases the kernel lock
        finally:
            self._local.release()

    # -- taking and giving back ---------------------------------------------------------------

    def acquire(self) -> None:
        """Take the lock, waiting up to ``wait_s`` for its owner.

        Raises:
            DatasetLocked: another live driver holds it (the message names it).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        while True:
            with self._guarded(wait_s=max(GUARD_WAIT_S, self.wait_s)):
                holder = self._holder()
                if holder is None or self._stale(holder):
                    try:
                        self._write_record()
                    except OSError as err:
                        raise DatasetLocked(
                            f"{self.path}: cannot write the lock file ({err.strerror or err}); "
                            "free space on its filesystem or make the folder writable"
                        ) from None
                    break
            if time.monotonic() >= deadline:
                raise DatasetLocked(self._describe(holder))
            time.sleep(RETRY_S)
        self.lost_to = None
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="commprof-lock", daemon=True)
        self._beat.start()

    def release(self) -> None:
        """Give the lock back (only if it is still ours)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=HEARTBEAT_S + GUARD_WAIT_S)
            self._beat = None
        try:
            with self._guarded():
                holder = self._holder()
                if holder is not None and holder.get("token") == self.token:
                    self.path.unlink(missing_ok=True)
        except DatasetLocked:  # the guard is held by a stopped process: the lock file stays;
            pass  # once this process has exited, the next driver finds it stale

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the folder for one commit: nothing is written unless it is still this lock's.

        No one takes the lock over while the block runs (that needs the guard, held here).

        Raises:
            LockLost: another process took the folder over (it presumed this one dead); the
                message names it. Nothing was written.
        """
        with self._guarded():
            holder = self._holder()
            if holder is None or holder.get("token") != self.token:
                self.lost_to = holder or {}
                raise LockLost(self._describe_lost(holder))
            yield

    def check(self) -> None:
        """Raise :class:`LockLost` where the heartbeat has seen the folder taken over (no file
        is read: a loop calls it every pass)."""
        if self.lost_to is not None:
            raise LockLost(self._describe_lost(self.lost_to or None))

    # -- the record -----------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        """What this lock writes into the lock file."""
        pid = os.getpid()
        return {
            "host": socket.gethostname(),
            "boot_id": boot_id(),
            "pid": pid,
            "pid_start": process_start(pid),
            "started_unix_s": time.time(),
            "token": self.token,
        }

    def _write_record(self) -> None:
        """Replace the lock file with this lock's record (under the guard): a temporary file in
        the folder, then a rename, so a reader never sees half a record."""
        tmp = self.path.with_name(f"{LOCK_NAME}.{self.token[:8]}.tmp")
        try:
            with open(tmp, "w") as handle:
                json.dump(self.record(), handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _holder(self) -> dict[str, Any] | None:
        """The lock file's record (:func:`parse_record`, with its age), or None where there is no
        lock file.

        Raises:
            DatasetLocked: something other than a regular file (a folder, a FIFO, a link) sits
                where the lock file belongs; the message names it.
        """
        try:
            info = os.lstat(self.path)
            if not stat.S_ISREG(info.st_mode):
                raise DatasetLocked(
                    f"{self.path} is not a regular file (a folder, a link or a FIFO) where the "
                    "lock file belongs; move it away, then rerun"
                )
            with open(self.path, "rb") as handle:
                data = handle.read(MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise DatasetLocked(
                f"{self.path}: cannot read the lock file ({err.strerror or err}); make it "
                "readable or move it away, then rerun"
            ) from None
        return {**parse_record(data), "age_s": time.time() - info.st_mtime}

    def _stale(self, holder: dict[str, Any]) -> bool:
        """Whether the owner of ``holder`` is gone (see the module docstring)."""
        pid, host = holder.get("pid"), holder.get("host")
        if host == socket.gethostname() and isinstance(pid, int):
            recorded_boot, this_boot = holder.get("boot_id"), boot_id()
            if recorded_boot is not None and this_boot is not None and recorded_boot != this_boot:
                return True  # the host rebooted: every process of the record's time is gone
            start = holder.get("pid_start")
            return not owner_alive(pid, start if isinstance(start, int) else None)
        return bool(holder["age_s"] > self.stale_s)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                with self._guarded(wait_s=HEARTBEAT_S):
                    holder = self._holder()
                    if holder is None or holder.get("token") != self.token:
                        self.lost_to = holder or {}
                        return  # taken over: stop touching someone else's lock
                    os.utime(self.path)
            except (DatasetLocked, OSError):
                continue  # the guard is busy (a contender's look) or the disk hiccupped: next beat

    # -- messages ---------------------------------------------------------------------------------

    def _describe(self, holder: dict[str, Any] | None, *, busy: bool = False) -> str:
        if holder is None:
            return f"{self.root} is in use by another driver (its lock came and went); run again"
        since = holder.get("started_unix_s")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
        state = " (it is in the middle of a commit)" if busy else ""
        return (
            f"{self.root} is in use by another driver: pid {holder.get('pid', '?')} on host "
            f"{holder.get('host', '?')}, since {when}{state} (lock file {self.path}, refreshed "
            f"{holder['age_s']:.0f} s ago). Wait for it to finish, {self.hint}."
        )

    def _describe_lost(self, holder: dict[str, Any] | None) -> str:
        if holder is None:
            who = "its lock file was removed"
        else:
            who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} took it over"
        return (
            f"{self.root}: this process (pid {os.getpid()}) no longer owns the folder: {who} "
            f"(lock file {self.path}); stopped before writing. What was committed before stays; "
            "rerun once the other driver is done to resume."
        )
