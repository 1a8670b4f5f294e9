"""Committed data is never overwritten: a table folder that is not a plain readable folder (a
dangling symbolic link, a link loop, a file) stops the sweep driver before Ray starts, naming
it; no reader takes it for an empty table and nothing is set aside; every file of an attempt is
created exclusively, never over an existing one. Real files, the real driver entry point."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from commprof import matrix, results
from commprof.attempts import resume_state
from commprof.sweeps import run_matrix

MATRIX = """
name: folders
axes:
  model: [srn-100k]
  world_size: [2]
  bucket_cap_mb: [1, 2]
defaults:
  steps: 3
"""
STEPS = [{"rank": r, "step": s, "measured": True, "step_ns": 10} for r in (0, 1) for s in range(3)]


def _dataset(tmp_path: Path) -> tuple[Path, Path, dict[Path, str]]:
    """A matrix file and a dataset with both its cells committed ok; the digest of every file."""
    spec = tmp_path / "m.yaml"
    spec.write_text(MATRIX)
    ds = tmp_path / "ds"
    for cell in matrix.load(spec).cells:
        row = results.cell_row(cell, sweep="folders", attempt=1, status="ok")
        results.write_attempt(ds, row, {"steps": STEPS, "buckets": [{"rank": 0, "step": 0}]})
    return spec, ds, _digests(tmp_path)


def _digests(root: Path) -> dict[Path, str]:
    return {
        p: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def _break(ds: Path, table: str, how: str) -> None:
    """Move the table's folder away (kept, beside the dataset) and put a link in its place."""
    os.replace(ds / table, ds.parent / f"{table}-kept")
    target = ds / table if how == "loop" else ds.parent / "nowhere"
    os.symlink(target, ds / table)


@pytest.mark.parametrize(("table", "how"), [("cells", "dangling"), ("cells", "loop"),
                                            ("steps", "dangling")])  # fmt: skip
def test_unreadable_table_folder_stops_the_driver_before_ray(
    tmp_path: Path,
    table: str,
    how: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec, ds, before = _dataset(tmp_path)
    _break(ds, table, how)
    # the driver reaches Ray only through connect(); a session's Ray may be up in this process
    connects: list[object] = []
    monkeypatch.setattr(run_matrix, "connect", lambda *a, **k: connects.append(a))
    rc = run_matrix.main(["--matrix", str(spec), "--out", str(ds)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and f"{ds / table} is a symbolic link to nothing" in err[0], err
    assert not connects
    # every committed measurement survives byte for byte, and nothing was set aside
    moved = {ds.parent / f"{table}-kept" / p.name: d for p, d in before.items()
             if p.parent == ds / table}  # fmt: skip
    kept = {p: d for p, d in before.items() if p.parent != ds / table} | moved
    assert {p: d for p, d in _digests(tmp_path).items() if p.suffix != ".yaml"} == {
        p: d for p, d in kept.items() if p.suffix != ".yaml"
    }
    assert not (ds / "damaged").exists()


@pytest.mark.parametrize("table", ["cells", "steps"])
def test_readers_refuse_an_unreadable_table_folder(tmp_path: Path, table: str) -> None:
    _, ds, before = _dataset(tmp_path)
    _break(ds, table, "dangling")
    for read in (resume_state, results.load, results.latest_status, results.damaged_attempts):
        with pytest.raises(results.UnreadableFolder, match=f"{table} is a symbolic link"):
            read(ds)
    cell = matrix.load(tmp_path / "m.yaml").cells[0]
    row = results.cell_row(cell, sweep="folders", attempt=2, status="ok")
    with pytest.raises(results.UnreadableFolder):
        results.write_attempt(ds, row, {"steps": STEPS})
    assert not (ds / "damaged").exists()
    assert _digests(ds.parent / f"{table}-kept") == {
        ds.parent / f"{table}-kept" / p.name: d for p, d in before.items() if p.parent == ds / table
    }


@pytest.mark.parametrize("kind", ["file", "fifo", "socket"])
def test_a_file_where_a_table_folder_belongs_is_named(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing but a folder can be listed, by root or anyone: a file, a FIFO, a socket."""
    ds = tmp_path / "ds"
    ds.mkdir()
    monkeypatch.chdir(ds)  # a socket's path is short (108 bytes at most): bind it relative
    if kind == "file":
        Path("steps").write_text("not a folder")
    elif kind == "fifo":
        os.mkfifo("steps")
    else:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind("steps")
    with pytest.raises(results.UnreadableFolder, match="steps is a file where"):
        results.check_writable(ds)
    with pytest.raises(results.UnreadableFolder, match="steps is a file where"):
        results.load(ds)


NOBODY = 65534
"""The unprivileged user and group a root test runs as where permissions must count."""


def _check_folders_unprivileged(ds: Path) -> str:
    """What ``check_folders`` raises for ``ds`` as a user whose permissions count: this user,
    or, under root (which reads every folder), a forked child that drops to ``NOBODY`` after
    entering ``ds`` (its parents may be closed to others). "" when nothing is raised."""
    if os.geteuid() != 0:
        try:
            results.check_folders(ds)
        except results.UnreadableFolder as err:
            return str(err)
        return ""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest code past this point, only the check and an exit
        said = "the child failed before the check"
        try:
            os.close(read)
            os.chdir(ds)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                results.check_folders(".")
                said = ""
            except results.UnreadableFolder as err:
                said = str(err)
        finally:
            os.write(write, said.encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


def test_an_unreadable_table_folder_is_named(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    (ds / "cells").mkdir(parents=True)
    ds.chmod(0o755)
    (ds / "cells").chmod(0)
    try:
        said = _check_folders_unprivileged(ds)
    finally:
        (ds / "cells").chmod(0o700)
    assert "cells cannot be read (Permission denied); make it readable" in said, said
    assert results.load(ds)["cells"].empty  # readable again: nothing was moved or lost


def test_files_of_an_attempt_are_created_exclusively(tmp_path: Path) -> None:
    target = tmp_path / "steps" / "x.parquet"
    target.parent.mkdir()
    target.write_bytes(b"committed")
    with pytest.raises(results.CommitFailed, match="exists already and is never replaced"):
        results._atomic_write_bytes(b"new", target, exclusive=True)
    assert target.read_bytes() == b"committed"
    assert [p.name for p in target.parent.iterdir()] == ["x.parquet"]  # no temporary left


def _no_link(code: int) -> Callable[[str, str], None]:
    """An ``os.link`` that fails with ``code``, as on a filesystem without hard links."""

    def link(src: str, dst: str) -> None:
        raise OSError(code, os.strerror(code), src, None, dst)

    return link


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV])
def test_without_hard_links_files_are_still_created_exclusively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(os, "link", _no_link(code))
    target = tmp_path / "steps" / "x.parquet"
    results._atomic_write_bytes(b"committed", target, exclusive=True)
    assert target.read_bytes() == b"committed"
    with pytest.raises(results.CommitFailed, match="exists already and is never replaced"):
        results._atomic_write_bytes(b"new", target, exclusive=True)
    assert target.read_bytes() == b"committed"
    assert [p.name for p in target.parent.iterdir()] == ["x.parquet"]  # no temporary left


@pytest.mark.parametrize(
    ("code", "remedy"),
    [(errno.EMLINK, "Too many links); fix that"), (errno.ENOSPC, "free space on its")],
)
def test_a_failed_exclusive_write_names_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, remedy: str
) -> None:
    monkeypatch.setattr(os, "link", _no_link(code))
    target = tmp_path / "steps" / "x.parquet"
    with pytest.raises(results.CommitFailed, match=re.escape(remedy)):
        results._atomic_write_bytes(b"new", target, exclusive=True)
    assert list(target.parent.iterdir()) == []  # neither the file nor a temporary


def test_leftovers_of_an_uncommitted_attempt_are_replaced(tmp_path: Path) -> None:
    spec = tmp_path / "m.yaml"
    spec.write_text(MATRIX)
    cell = matrix.load(spec).cells[0]
    name = f"{cell.cell_id}-a1.parquet"
    for table in ("steps", "buckets"):  # a driver killed before its commit left these
        (tmp_path / "ds" / table).mkdir(parents=True)
        (tmp_path / "ds" / table / name).write_bytes(b"leftover")
    row = results.cell_row(cell, sweep="folders", attempt=1, status="ok")
    results.write_attempt(tmp_path / "ds", row, {"steps": STEPS})
    tables = results.load(tmp_path / "ds")
    assert len(tables["steps"]) == len(STEPS) and tables["buckets"].empty
    assert not (tmp_path / "ds" / "buckets" / name).exists()
