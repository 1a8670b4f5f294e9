"""The trace reader's gzip path reads every file, and fails on every file, as gzip.open does."""

from __future__ import annotations

import functools
import gzip
import zlib
from pathlib import Path

import pytest

from commprof.traces.gunzip import READ_BYTES, GunzipReader

TEXT = b"".join(
    b'{"ph": "X", "name": "op%d", "ts": %d, "dur": 1},\n' % (i, i) for i in range(40000)
)
"""About 1.9 MB: several of the reader's reads of compressed bytes."""


def _member(text: bytes) -> bytes:
    return gzip.compress(text, compresslevel=6, mtime=0)


@functools.cache
def _cases() -> dict[str, bytes]:
    one = _member(TEXT)
    assert len(one) > 2 * READ_BYTES // 8  # the stream spans several inflate calls
    trailer_at = len(one) - 8
    bad_crc = one[:trailer_at] + bytes([one[trailer_at] ^ 0xFF]) + one[trailer_at + 1 :]
    bad_len = one[:-1] + bytes([one[-1] ^ 0xFF])
    middle = len(one) // 2
    return {
        "plain": one,
        "two members": one + _member(b"more text"),
        "empty member after": one + _member(b""),
        "zero padding": one + b"\0" * 64,
        "garbage after": one + b"not gzip",
        "truncated": one[: len(one) // 3],
        "trailer cut": one[:-4],
        "header only": one[:10],
        "bad crc": bad_crc,
        "bad length": bad_len,
        "corrupt middle": one[:middle]
        + bytes(b ^ 0x5A for b in one[middle : middle + 64])
        + one[middle + 64 :],
    }


def _read_all(fh: object, size: int) -> tuple[bytes, str | None]:
    """Everything ``fh`` serves ``size`` at a time, and the error that ended it (type: text)."""
    got = []
    try:
        while True:
            data = fh.read(size)  # type: ignore[attr-defined]
            if not data:
                return b"".join(got), None
            got.append(data)
    except (OSError, EOFError, zlib.error) as exc:
        return b"".join(got), f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("size", [1000, 1 << 18, -1])
@pytest.mark.parametrize("case", sorted(_cases()))
def test_each_file_reads_and_fails_as_gzip_open_reads_it(
    tmp_path: Path, case: str, size: int
) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(_cases()[case])
    with gzip.open(path, "rb") as fh:
        want = _read_all(fh, size)
    with GunzipReader(path) as fh:
        got = _read_all(fh, size)
    assert got == want
    if case == "plain":
        assert got == (TEXT, None)
    if case in ("truncated", "trailer cut", "bad crc", "bad length", "corrupt middle"):
        assert want[1] is not None  # a damaged file is an error, never a short text
