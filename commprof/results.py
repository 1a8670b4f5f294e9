"""The collected dataset: schema, atomic writes, loading (pandas and Ray Data).

Layout of a dataset folder (docs/design.md, "The dataset")::

    DIR/<table>/<cell_id>-a<attempt>.parquet     one file per table per cell attempt

Every file is written to a temporary name in the same folder and renamed into place, so a
reader never sees half a file. The ``cells`` file of an attempt is written last: it is the
commit record. Rows of the other tables count only when their (cell_id, attempt) has a cells
row, so an attempt the driver was killed in the middle of writing is invisible, and its
leftovers are overwritten when the cell runs again.

The commit record carries the SHA-256 of every other file of its attempt (``checksums_json``)
and of its own row (``commit_sha256``); the SHA-256 of every byte of the commit record's own
file, which cannot hold its own digest, is in ``cells/.<cell_id>-a<attempt>.sha256`` beside it,
written before it (the row marks that it has one). :func:`load` verifies them and names a
damaged file; :func:`set_aside_damaged` moves every file of a damaged attempt to
``DIR/damaged/`` so that a rerun runs the cell again (attempts committed before checksums
existed are not verified; those committed before the sidecar only by their row).

A write that fails (a full disk, a folder made read-only) raises :class:`CommitFailed` naming
the path; the attempt is then not committed.

This module imports no torch and no ray at module level.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from commprof.fileio import as_umask_allows
from commprof.matrix import CELL_COLUMNS

if TYPE_CHECKING:
    import ray.data

_KEY = [("cell_id", pa.string()), ("attempt", pa.int32())]

SCHEMAS: dict[str, pa.Schema] = {
    "cells": pa.schema(
        [
            *_KEY,
            ("status", pa.string()),  # ok | failed | rejected
            ("error", pa.string()),
            ("error_kind", pa.string()),  # transient | deterministic | timeout | None
            ("sweep", pa.string()),
            # the configuration: the cell fields that have a column (commprof.matrix.Cell)
            *((name, getattr(pa, arrow_type)()) for name, arrow_type in CELL_COLUMNS),
            ("num_params", pa.int64()),
            ("regime", pa.string()),
            ("config_json", pa.string()),
            ("guard_json", pa.string()),
            ("env_json", pa.string()),
            ("nodes", pa.string()),
            ("started_unix_s", pa.float64()),
            ("wall_s", pa.float64()),  # the attempt, driver side
            ("rank_wall_s", pa.float64()),  # the slowest rank's own time in the cell
            # 1-minute load average of the host (os.getloadavg): read by rank 0 when training
            # ended for a cell that ran, by the committing process for a failed or rejected one
            ("load_avg_1m", pa.float64()),
            # integrity: SHA-256 of every file of the attempt, and of this row itself
            ("checksums_json", pa.string()),
            ("commit_sha256", pa.string()),
        ]
    ),
    "steps": pa.schema(
        [
            *_KEY,
            ("rank", pa.int32()),
            ("step", pa.int32()),
            ("measured", pa.bool_()),
            ("start_ns", pa.int64()),  # host clock at step start: the hook's clock
            ("step_ns", pa.int64()),
            ("forward_ns", pa.int64()),
            ("backward_ns", pa.int64()),
            ("optimizer_ns", pa.int64()),
        ]
    ),
    "buckets": pa.schema(
        [
            *_KEY,
            ("rank", pa.int32()),
            ("step", pa.int32()),
            ("bucket_index", pa.int32()),
            ("num_bytes", pa.int64()),
            ("num_params", pa.int32()),
            ("ready_ns", pa.int64()),
            ("launch_ns", pa.int64()),
            ("done_ns", pa.int64()),
            ("latency_ns", pa.int64()),
            ("transfer_ns", pa.int64()),
            ("exposed_ns", pa.int64()),
            ("device_latency_ns", pa.int64()),
        ]
    ),
    "bucket_params": pa.schema(
        [
            *_KEY,
            ("bucket_index", pa.int32()),
            ("position", pa.int32()),
            ("param_name", pa.string()),
            ("module", pa.string()),
            ("module_type", pa.string()),  # the owning module's class name (null in older datasets)
            ("numel", pa.int64()),
            ("num_bytes", pa.int64()),
        ]
    ),
    "microbench": pa.schema(
        [
            *_KEY,
            ("num_bytes", pa.int64()),
            ("dtype", pa.string()),
            ("num_iters", pa.int32()),
            ("time_p50_ns", pa.int64()),
            ("time_min_ns", pa.int64()),
            ("time_max_ns", pa.int64()),
            ("transfer_p50_ns", pa.int64()),  # shortest rank per iteration: no waiting
            ("time_mean_ns", pa.int64()),  # mean over iterations (null before 2.1)
            ("algbw_gbps", pa.float64()),
            ("busbw_gbps", pa.float64()),
            ("num_wrong", pa.int64()),
            ("source", pa.string()),  # "sizes" (from the matrix) or "bucket" (the model's)
        ]
    ),
    "interference": pa.schema(
        [
            *_KEY,
            ("arm", pa.string()),  # comm_under_compute | compute_under_comm | comm_burst
            ("num_bytes", pa.int64()),  # all-reduce message size
            ("num_iters_alone", pa.int32()),
            ("num_iters_loaded", pa.int32()),
            ("time_alone_p50_ns", pa.int64()),
            ("time_loaded_p50_ns", pa.int64()),
            ("slowdown", pa.float64()),  # loaded p50 / alone p50
            ("slowdown_q25", pa.float64()),
            ("slowdown_q75", pa.float64()),
            ("slowdown_mean", pa.float64()),  # mean loaded / mean alone (null before 2.1)
        ]
    ),
    "hook_cost": pa.schema(
        [
            *_KEY,
            ("rank", pa.int32()),
            ("pair", pa.int32()),
            ("arm", pa.string()),  # hooked (commprof's timing hook) | plain (DDP without it)
            ("position", pa.int32()),  # 0: stepped first in its pair
            ("step_ns", pa.int64()),
            ("backward_ns", pa.int64()),
        ]
    ),
    "trace_metrics": pa.schema(
        [
            *_KEY,
            ("rank", pa.int32()),
            ("step", pa.int32()),
            ("window_ns", pa.int64()),
            ("comm_ns", pa.int64()),
            ("compute_ns", pa.int64()),
            ("overlap_ns", pa.int64()),
            ("exposed_ns", pa.int64()),
            ("idle_ns", pa.int64()),
            ("other_ns", pa.int64()),
            ("overlap_efficiency", pa.float64()),
            ("comm_overhead_fraction", pa.float64()),
            # cross-check against the timing hook: buckets matched to collectives this step
            ("num_collectives", pa.int32()),
            ("hook_latency_ns", pa.int64()),
            ("trace_collective_ns", pa.int64()),
            ("bucket_exposed_ns", pa.int64()),
            # where the step windows came from (ProfilerStep on the CPU or on the device)
            ("window_source", pa.string()),
        ]
    ),
}
TABLES = tuple(SCHEMAS)
"""Table names, ``cells`` first."""

LATER_COLUMNS = frozenset({"load_avg_1m"})
"""``cells`` columns added after checksums existed: a null there is left out of the row digest,
so attempts committed before the column existed still verify."""

_FILE_RE = re.compile(r"^(?P<cell>[0-9a-f]{12})-a(?P<attempt>\d+)\.parquet$")
SIDECAR = "sidecar"
"""The value under the ``cells`` file's own name in ``checksums_json``: its digest is in its
sidecar file (:func:`sidecar_path`), not in the row it holds."""


class CommitFailed(RuntimeError):
    """A file of an attempt could not be written; the message names it and what to do."""


class UnreadableFolder(ValueError):
    """A folder of the dataset (a table's, ``traces/`` or ``damaged/``) that is there but is not
    a folder that can be read: a dangling symbolic link, a link loop, a file, no permission.

    Read as empty it would make committed cells look never run (and their files overwritten or
    set aside), so every reader and writer stops on it instead, naming it.
    """


DATA_FOLDERS = (*TABLES, "traces", "damaged")
"""The folders of a dataset folder that hold its files."""


def check_folders(root: str | Path) -> None:
    """Refuse a dataset whose table folders are not plain readable folders.

    A missing folder is fine (nothing recorded there yet); a symbolic link to a readable folder
    is followed.

    Raises:
        UnreadableFolder: naming the first such folder and what to do.
    """
    root = Path(root)
    for name in DATA_FOLDERS:
        folder = root / name
        if not os.path.lexists(folder):
            continue
        if not folder.is_dir() and not folder.is_symlink():
            raise UnreadableFolder(
                f"{folder} is a file where the dataset keeps a folder; move it away or use "
                "another --out"
            )
        if not folder.is_dir():
            raise UnreadableFolder(
                f"{folder} is a symbolic link to nothing (dangling or a loop); the dataset keeps "
                f"its {name} files there: restore what it points to (or move the link away to "
                "start that table empty), then rerun"
            )
        try:
            with os.scandir(folder) as entries:
                next(entries, None)
        except OSError as err:
            raise UnreadableFolder(
                f"{folder} cannot be read ({err.strerror or err}); make it readable, then rerun"
            ) from None


def sidecar_path(cells_file: Path) -> Path:
    """Where the SHA-256 of every byte of a committed ``cells`` file is kept: a hidden file
    beside it, which Parquet readers of the folder skip (``pd.read_parquet(DIR / "cells")``, Ray
    Data and pyarrow datasets ignore names starting with ``.``)."""
    return cells_file.with_name(f".{cells_file.stem}.sha256")


def _to_table(name: str, rows: list[dict[str, Any]]) -> pa.Table:
    """Rows -> an Arrow table with the table's schema; unknown columns are an error."""
    schema = SCHEMAS[name]
    extra = set().union(*(row.keys() for row in rows)) - set(schema.names)
    if extra:
        raise ValueError(f"table {name!r} has no columns {sorted(extra)}; schema: {schema.names}")
    columns = {f.name: [row.get(f.name) for row in rows] for f in schema}
    return pa.Table.from_pydict(columns, schema=schema)


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def _atomic_write(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` through a temporary file in the same folder and a rename."""
    _atomic_write_bytes(_parquet_bytes(table), path)


NO_HARD_LINK_ERRNOS = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS}
)
"""What ``os.link`` raises on a filesystem without hard links (FAT, some network and FUSE
filesystems): an exclusive create is used there instead."""


def _create_exclusively(data: bytes, path: Path) -> None:
    """Create ``path`` with ``data``, failing where the name is taken (``O_EXCL``): a file
    without hard links gets its exclusive commit so, visible before its last byte is written;
    a partly written file of its own is removed on failure (never one that was there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # FileExistsError if taken
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _what_to_do(err: OSError) -> str:
    """The remedy of a failed write, from its cause."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its filesystem"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make it writable"
    return "fix that"


def _atomic_write_bytes(data: bytes, path: Path, *, exclusive: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    Args:
        data: the bytes.
        path: where they go.
        exclusive: never replace a file already at ``path`` (a hard link of the temporary file
            that fails where the name is taken, instead of a rename over it; on a filesystem
            without hard links, an exclusive create of ``path``: :func:`_create_exclusively`).

    Raises:
        CommitFailed: the folder or the file could not be written (a full disk, no
            permission, or ``path`` taken under ``exclusive``); it names the path and the
            cause, and no temporary file is left behind.
    """
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        as_umask_allows(fd)  # mkstemp's 0600 is not the user's choice
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(tmp, path)  # FileExistsError where the name is taken: nothing replaced
            except FileExistsError:
                raise
            except OSError as err:
                if err.errno not in NO_HARD_LINK_ERRNOS:
                    raise
                _create_exclusively(data, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except FileExistsError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise CommitFailed(
            f"{path} exists already and is never replaced; another driver wrote to this folder "
            "(each folder has one owner: see commprof.lock)"
        ) from None
    except OSError as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        cause = err.strerror or str(err)
        raise CommitFailed(
            f"cannot write {path} ({cause}); {_what_to_do(err)}, then rerun to resume (a cell "
            "counts only once its cells file is written)"
        ) from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_attempt(
    root: str | Path,
    cell_row: Mapping[str, Any],
    tables: Mapping[str, list[dict[str, Any]]],
    traces: Mapping[str, bytes] | None = None,
) -> None:
    """Write one finished cell attempt: traces, every table's rows, then the cells row (commit).

    Args:
        root: the dataset folder.
        cell_row: the row of the ``cells`` table; must hold ``cell_id`` and ``attempt``.
        tables: rows by table name (any of ``TABLES`` but ``cells``); the key columns are
            filled in from ``cell_row``.
        traces: compressed profiler traces by file name, kept under
            ``traces/<cell_id>-a<attempt>/`` (a folder ``commprof analyze`` reads).
    """
    root = Path(root)
    cell_id, attempt = str(cell_row["cell_id"]), int(cell_row["attempt"])
    if not re.fullmatch(r"[0-9a-f]{12}", cell_id):
        raise ValueError(f"cell_id {cell_id!r} is not a 12-digit hex id")
    file_name = f"{cell_id}-a{attempt}.parquet"
    # Only where every folder reads as it is can a file without its commit be a leftover.
    check_folders(root)
    if os.path.lexists(root / "cells" / file_name):  # committed: never touched again
        raise ValueError(
            f"attempt {attempt} of cell {cell_id} is already committed in {root}; another "
            "driver wrote to this folder (each folder has one owner: see commprof.lock)"
        )
    # Leftovers of this attempt from a driver killed before its commit must not be adopted.
    for name in TABLES[1:]:
        (root / name / file_name).unlink(missing_ok=True)
    sidecar_path(root / "cells" / file_name).unlink(missing_ok=True)
    shutil.rmtree(root / "traces" / f"{cell_id}-a{attempt}", ignore_errors=True)
    sums: dict[str, str] = {}
    for trace_name, data in (traces or {}).items():
        if "/" in trace_name or trace_name.startswith("."):
            raise ValueError(f"trace file name {trace_name!r} must be a plain file name")
        relative = f"traces/{cell_id}-a{attempt}/{trace_name}"
        _atomic_write_bytes(data, root / relative, exclusive=True)
        sums[relative] = hashlib.sha256(data).hexdigest()
    for name, rows in tables.items():
        if name == "cells" or name not in SCHEMAS:
            raise ValueError(f"unknown table {name!r}; expected one of {TABLES[1:]}")
        if rows:
            keyed = [{**row, "cell_id": cell_id, "attempt": attempt} for row in rows]
            data = _parquet_bytes(_to_table(name, keyed))
            _atomic_write_bytes(data, root / name / file_name, exclusive=True)
            sums[f"{name}/{file_name}"] = hashlib.sha256(data).hexdigest()
    sums[f"cells/{file_name}"] = SIDECAR  # its own bytes: in the sidecar, written first
    row = {**cell_row, "checksums_json": json.dumps(sums, sort_keys=True), "commit_sha256": None}
    row["commit_sha256"] = _row_digest(_to_table("cells", [row]).to_pylist()[0])
    commit = _parquet_bytes(_to_table("cells", [row]))
    cells_file = root / "cells" / file_name
    digest = hashlib.sha256(commit).hexdigest()
    _atomic_write_bytes(f"{digest}\n".encode(), sidecar_path(cells_file), exclusive=True)
    _atomic_write_bytes(commit, cells_file, exclusive=True)


def _row_digest(row: Mapping[str, Any]) -> str:
    """SHA-256 of a cells row as Arrow gives it back, ``commit_sha256`` itself left out."""
    fields = {
        k: v
        for k, v in row.items()
        if k != "commit_sha256" and not (k in LATER_COLUMNS and v is None)
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


class DamagedDataset(ValueError):
    """Committed files that are missing, unreadable or not what was written.

    Args:
        damaged: what is wrong, by (cell id, attempt).
    """

    def __init__(self, root: Path, damaged: dict[tuple[str, int], str]) -> None:
        first = "; ".join(f"{cell}-a{attempt}: {why}" for (cell, attempt), why in damaged.items())
        super().__init__(
            f"{root}: {len(damaged)} damaged attempt(s): {first[:1500]}. Rerun the sweep or "
            "commprof run on this folder (it sets them aside under damaged/ and runs those "
            "cells again), or load with verify=False to read the rest."
        )
        self.damaged = damaged


def damaged_attempts(root: str | Path, *, traces: bool = True) -> dict[tuple[str, int], str]:
    """Committed attempts whose files are not as committed, with the first problem of each.

    Args:
        root: the dataset folder.
        traces: also hash the kept profiler traces (the largest files).
    """
    root = Path(root)
    check_folders(root)  # a table folder that cannot be read is not a damaged attempt
    damaged: dict[tuple[str, int], str] = {}
    for path in _committed_files(root, "cells", None):
        key = _key_of(path)
        problem = _sidecar_problem(path)
        if problem:
            damaged[key] = problem
            continue
        try:
            rows = pq.read_table(path, schema=SCHEMAS["cells"]).to_pylist()
        except (OSError, pa.ArrowException) as err:
            damaged[key] = f"{path} cannot be read ({str(err).splitlines()[0][:200]})"
            continue
        if len(rows) != 1 or (rows[0]["cell_id"], rows[0]["attempt"]) != key:
            damaged[key] = f"{path} does not hold the row of its attempt"
            continue
        row = rows[0]
        if row["commit_sha256"] is None:
            continue  # committed before checksums existed
        if _row_digest(row) != row["commit_sha256"]:
            damaged[key] = f"{path} changed since it was written (checksum)"
            continue
        for relative, digest in json.loads(row["checksums_json"] or "{}").items():
            if relative.startswith("traces/") and not traces:
                continue
            if digest == SIDECAR:  # checked above, where there is a sidecar; it must be there
                sidecar = sidecar_path(root / relative)
                problem = None if sidecar.exists() else f"{sidecar} (its checksum) is missing"
            else:
                problem = _file_problem(root / relative, digest)
            if problem:
                damaged[key] = problem
                break
    return damaged


def _sidecar_problem(cells_file: Path) -> str | None:
    """Where a ``cells`` file has a sidecar: whether every byte is as it was written."""
    sidecar = sidecar_path(cells_file)
    try:
        digest = sidecar.read_text().strip()
    except FileNotFoundError:
        return None  # committed before sidecars, or the row says it is missing (checked later)
    except (OSError, UnicodeDecodeError) as err:
        return f"{sidecar} cannot be read ({err})"
    return _file_problem(cells_file, digest)


def _file_problem(path: Path, digest: str) -> str | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as err:
        return f"{path} cannot be read ({err.strerror})"
    if hashlib.sha256(data).hexdigest() != digest:
        return f"{path} changed since it was written (checksum)"
    return None


def _key_of(path: Path) -> tuple[str, int]:
    match = _FILE_RE.match(path.name)
    assert match is not None  # _committed_files lists only names it matches
    return match["cell"], int(match["attempt"])


def set_aside_damaged(root: str | Path) -> dict[str, tuple[int, str]]:
    """Move every file of each damaged attempt to ``DIR/damaged/<cell>-a<N>/`` (kept, never
    deleted), so the cell counts as not run and a rerun runs it again.

    Returns:
        Per damaged cell id: the attempt set aside and what was wrong.
    """
    root = Path(root)
    moved: dict[str, tuple[int, str]] = {}
    for (cell_id, attempt), why in damaged_attempts(root).items():
        stem = f"{cell_id}-a{attempt}"
        aside = root / "damaged" / f"{stem}-{int(time.time())}"
        try:
            aside.mkdir(parents=True, exist_ok=True)
            for name in TABLES:
                source = root / name / f"{stem}.parquet"
                others = (source, sidecar_path(source)) if name == "cells" else (source,)
                for path in others:
                    if os.path.lexists(path):  # a dangling symbolic link is moved too
                        (aside / name).mkdir(exist_ok=True)
                        os.replace(path, aside / name / path.name)
            if os.path.lexists(root / "traces" / stem):
                os.replace(root / "traces" / stem, aside / "traces")
            (aside / "WHY.txt").write_text(why + "\n")
        except OSError as err:
            raise CommitFailed(
                f"cannot set aside the damaged attempt {stem} into {aside} "
                f"({err.strerror or err}): {why}"
            ) from None
        moved[cell_id] = (max(attempt, moved.get(cell_id, (0, ""))[0]), why)
    return moved


def _committed_files(root: Path, table: str, keys: set[tuple[str, int]] | None) -> list[Path]:
    folder = root / table
    if not folder.is_dir():
        return []
    files = []
    for path in sorted(folder.iterdir()):
        match = _FILE_RE.match(path.name)
        if match is None:
            continue  # temporary files and anything that is not ours
        key = (match["cell"], int(match["attempt"]))
        if keys is None or key in keys:
            files.append(path)
    return files


def _read(files: Iterable[Path], table: str) -> pd.DataFrame:
    parts = [pq.read_table(path, schema=SCHEMAS[table]) for path in files]
    if not parts:
        return SCHEMAS[table].empty_table().to_pandas()
    return pa.concat_tables(parts).to_pandas()


def load(root: str | Path, *, verify: bool = True) -> dict[str, pd.DataFrame]:
    """The collected dataset as pandas DataFrames by table name.

    Only committed attempts are included (see the module docstring); every table is present,
    empty where nothing was recorded.

    Args:
        root: the dataset folder (``results/<sweep>/`` by default).
        verify: check every committed table file against its checksum first (the traces are
            not read here: ``damaged_attempts`` checks them).

    Returns:
        ``{table: DataFrame}`` for every name in ``TABLES``.

    Raises:
        DamagedDataset: a committed file is missing, unreadable or changed; it names the file.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no dataset folder at {root}; run a sweep or pass --out")
    check_folders(root)
    if verify:
        damaged = damaged_attempts(root, traces=False)
        if damaged:
            raise DamagedDataset(root, damaged)
    cells = _read(_committed_files(root, "cells", None), "cells")
    keys = set(zip(cells["cell_id"], cells["attempt"].astype(int), strict=True))
    out = {"cells": cells}
    for table in TABLES[1:]:
        out[table] = _read(_committed_files(root, table, keys), table)
    return out


def load_dataset(root: str | Path, table: str) -> ray.data.Dataset:
    """One table of the dataset as a Ray Dataset (``ray.data.read_parquet``), committed rows only.

    Args:
        root: the dataset folder.
        table: a name from ``TABLES``.

    Returns:
        The Ray Dataset.
    """
    from commprof.extras import require

    # the one place results touches Ray: only when asked for a Ray Dataset
    ray_data = require("ray.data", needed_by="commprof.results.load_dataset")

    if table not in SCHEMAS:
        raise ValueError(f"unknown table {table!r}; expected one of {TABLES}")
    root = Path(root)
    keys = None
    if table != "cells":
        cells = load(root)["cells"]
        keys = set(zip(cells["cell_id"], cells["attempt"].astype(int), strict=True))
    files = _committed_files(root, table, keys)
    if not files:
        return ray_data.from_arrow(SCHEMAS[table].empty_table())
    return ray_data.read_parquet([str(p) for p in files], schema=SCHEMAS[table])


def latest_status(root: str | Path) -> dict[str, tuple[str, int, str | None]]:
    """Per cell id, the status, attempt number and error kind of its latest committed attempt;
    an ``ok`` attempt stands over any later one (a complete cell is never run again).

    A ``cells`` file that cannot be read is left out here (:func:`damaged_attempts` names it,
    and resuming sets it aside first).
    """
    root = Path(root)
    if not root.is_dir():
        return {}
    check_folders(root)
    parts = []
    for path in _committed_files(root, "cells", None):
        try:
            parts.append(pq.read_table(path, schema=SCHEMAS["cells"]))
        except (OSError, pa.ArrowException):
            continue
    if not parts:
        return {}
    cells = pa.concat_tables(parts).to_pandas()
    out: dict[str, tuple[str, int, str | None]] = {}
    for cell_id, status, attempt, kind in cells.sort_values("attempt")[
        ["cell_id", "status", "attempt", "error_kind"]
    ].itertuples(index=False):
        if out.get(str(cell_id), ("",))[0] == "ok":
            continue
        out[str(cell_id)] = (str(status), int(attempt), kind if isinstance(kind, str) else None)
    return out


def check_writable(root: str | Path) -> Path:
    """Make sure attempts can be committed to ``root`` before anything runs.

    Creates the folder where it is missing and writes and removes a probe file in it and in
    each table folder that exists already, so a read-only folder, a file given as ``--out`` or
    a plain file where a table folder belongs is reported now, not after a cell has run.

    Args:
        root: the dataset folder (``--out``).

    Returns:
        The folder.

    Raises:
        ValueError: naming the path and what to change.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ValueError(f"--out {root} is a file, not a folder; give a dataset folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--out {root}: cannot create the folder ({err.strerror})") from None
    check_folders(root)
    for folder in (root, *(root / name for name in (*TABLES, "traces"))):
        if folder.exists() and not folder.is_dir():
            raise ValueError(
                f"{folder} is a file where the dataset keeps a folder; move it away or use "
                "another --out"
            )
        if not folder.is_dir():
            continue
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".commprof-probe-"):
                pass
        except OSError as err:
            raise ValueError(
                f"{folder} is not writable ({err.strerror}); use another --out"
            ) from None
    return root


def commit_attempt(
    root: str | Path,
    cell: Any,
    *,
    per_rank: list[dict[str, Any]] | None = None,
    error: str | None = None,
    error_kind: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Commit one attempt that ran: the one path of the sweep driver and ``commprof run``.

    Args:
        root: the dataset folder.
        cell: the cell.
        per_rank: the ranks' results in rank order (a success), or None with ``error`` (a
            failure). The slowest rank's own ``wall_s`` becomes the row's ``rank_wall_s``.
        error: the grouped failure text.
        error_kind: transient, deterministic or timeout.
        fields: the rest of :func:`cell_row` (sweep, attempt, num_params, guard, nodes,
            started_unix_s, wall_s).

    Returns:
        The committed ``cells`` row.
    """
    from commprof.outcomes import merge_rank_records, merge_rank_traces

    if per_rank is None:
        row = cell_row(
            cell,
            status="failed",
            error=error,
            error_kind=error_kind,
            load_avg_1m=host_load_avg_1m(),
            **fields,
        )
        write_attempt(root, row, {})
        return row
    rank_walls = [float(r["wall_s"]) for r in per_rank if "wall_s" in r]
    row = cell_row(
        cell,
        status="ok",
        env=per_rank[0]["env"],
        rank_wall_s=max(rank_walls) if rank_walls else None,
        load_avg_1m=per_rank[0]["env"].get("load_avg_1m"),
        **fields,
    )
    write_attempt(root, row, merge_rank_records(per_rank), merge_rank_traces(per_rank))
    return row


def cell_row(
    cell: Any,
    *,
    sweep: str,
    attempt: int,
    status: str,
    num_params: int | None = None,
    error: str | None = None,
    error_kind: str | None = None,
    guard: Mapping[str, Any] | None = None,
    env: Mapping[str, Any] | None = None,
    nodes: Iterable[str] = (),
    started_unix_s: float | None = None,
    wall_s: float | None = None,
    rank_wall_s: float | None = None,
    load_avg_1m: float | None = None,
) -> dict[str, Any]:
    """The ``cells`` row of one attempt of a :class:`commprof.matrix.Cell`.

    Args:
        cell: the cell (duck-typed so this module needs nothing but its fields).
        sweep: the matrix name.
        attempt: 1 for the first attempt.
        status: ok, failed or rejected.
        num_params: the model's parameter count.
        error: the failure text (failed) or the guard's arithmetic (rejected).
        error_kind: transient, deterministic or timeout, for failures.
        guard: the memory guard's decision record.
        env: the environment fingerprint of rank 0.
        nodes: the Ray node ids (or host names) the ranks ran on.
        started_unix_s: when the attempt started.
        wall_s: how long it took, end to end, as the driver saw it.
        rank_wall_s: the slowest rank's own time from store to records (the difference to
            ``wall_s`` is the orchestration overhead).
        load_avg_1m: the host's 1-minute load average when the attempt ended
            (:func:`host_load_avg_1m`; None where it was not read).
    """
    if status not in ("ok", "failed", "rejected"):
        raise ValueError(f"status {status!r} is not one of ok, failed, rejected")
    config = cell.config()
    return {
        "cell_id": cell.cell_id,
        "attempt": attempt,
        "status": status,
        "error": error,
        "error_kind": error_kind,
        "sweep": sweep,
        "num_params": num_params,
        **{k: v for k, v in config.items() if k in SCHEMAS["cells"].names},
        "regime": cell.regime,
        "config_json": json.dumps(config, sort_keys=True),
        "guard_json": json.dumps(guard, sort_keys=True) if guard is not None else None,
        "env_json": json.dumps(env, sort_keys=True) if env is not None else None,
        "nodes": ",".join(nodes),
        "started_unix_s": started_unix_s,
        "wall_s": wall_s,
        "rank_wall_s": rank_wall_s,
        "load_avg_1m": load_avg_1m,
    }


def host_load_avg_1m() -> float | None:
    """This host's 1-minute load average (``os.getloadavg``), None where the OS has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None
