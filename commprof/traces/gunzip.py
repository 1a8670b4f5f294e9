"""A gzip file's text read straight through one inflate stream, as :func:`gzip.open` reads it.

The trace reader asks for the text a quarter MiB at a time. ``gzip.GzipFile`` serves each
request through a buffered reader, a Python loop of small inflate calls and a CRC32 of every
byte in Python; one decompressor that parses the gzip header and checks the CRC and length
itself does the same work in a few C calls. That decompressor is ISA-L's (``isal``, the
``zlib`` interface over Intel's inflate: the same bytes out, in about half of ``zlib``'s CPU
time). Anything beyond a single well-formed gzip member (another member, padding, data after
it, a truncated or corrupt stream) is left to ``gzip``: the file is reopened with it, the text
already served is skipped, and it serves (or refuses) the rest, so every file reads, and
fails, exactly as with ``gzip.open``.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from types import TracebackType
from typing import cast

from isal import isal_zlib

READ_BYTES = 1 << 16
"""Compressed bytes read from the file at a time."""
_GZIP_WBITS = 16 + zlib.MAX_WBITS
"""Window bits that read (and check) the gzip header and trailer (``zlib``'s convention)."""
_ISAL_ERROR = cast(type[Exception], isal_zlib.error)  # isal's stub types it as an instance


class _Unusual(Exception):
    """The stream is not one plain gzip member: ``gzip`` reads it from here on."""


class GunzipReader:
    """``read(n)`` of a gzip file's decompressed text (a binary file object's ``read``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.raw = open(path, "rb")  # noqa: SIM115  # closed by close()
        self.inflate = isal_zlib.decompressobj(_GZIP_WBITS)
        self.served = 0
        """Decompressed bytes returned so far."""
        self.slow: gzip.GzipFile | None = None
        """The ``gzip`` reader that took over (see the module docstring), else None."""

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes of text (``b""`` at the end); all the rest if ``size`` < 0."""
        if self.slow is None:
            try:
                data = self._inflated(size)
            except (_Unusual, zlib.error, _ISAL_ERROR):
                self._take_over()
            else:
                self.served += len(data)
                return data
        assert self.slow is not None
        return self.slow.read(size)

    def _inflated(self, size: int) -> bytes:
        parts: list[bytes] = []
        wanted = size if size >= 0 else 1 << 62
        while wanted > 0 and not self.inflate.eof:
            data = self.inflate.unconsumed_tail or self.raw.read(READ_BYTES)
            if not data:
                raise _Unusual("truncated")  # gzip says how (EOFError)
            part = self.inflate.decompress(data, wanted)
            wanted -= len(part)
            parts.append(part)
        if self.inflate.eof and (self.inflate.unused_data or self.raw.read(1)):
            raise _Unusual("more after the first member")
        return b"".join(parts)

    def _take_over(self) -> None:
        """Reopen with ``gzip`` and skip the text served (its errors are the file's)."""
        self.slow = gzip.open(self.path, "rb")  # type: ignore[assignment]  # noqa: SIM115
        assert self.slow is not None
        left = self.served
        while left > 0:
            skipped = len(self.slow.read(min(left, 1 << 22)))
            if not skipped:
                break
            left -= skipped

    def close(self) -> None:
        self.raw.close()
        if self.slow is not None:
            self.slow.close()

    def __enter__(self) -> GunzipReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
