"""The mode of the files commprof writes: what the user's umask gives a new file.

Files written through a temporary file (``tempfile.mkstemp``: mode 0600 whatever the umask) and
a rename keep the temporary file's mode; :func:`as_umask_allows` gives them the mode an
``open(path, "w")`` would have (0644 under the usual umask 022, 0600 under 077), so a dataset is
as readable by others as the user's other files, and private where the user's umask says so.
"""

from __future__ import annotations

import os
import threading

_LOCK = threading.Lock()


def umask() -> int:
    """This process's umask (read from ``/proc/self/status`` where Linux has it, else set and
    restored under a lock)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode a regular file created now gets: 0666 less the umask."""
    return 0o666 & ~umask()


def as_umask_allows(fd: int) -> None:
    """Give the open file ``fd`` (a temporary file about to be renamed into place) the mode a
    newly created file gets under the umask."""
    os.fchmod(fd, new_file_mode())
