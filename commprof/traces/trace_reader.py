"""Chrome / Kineto trace reader: msgspec decoding in bounded-memory chunks.

A trace file (``.json``, or gzip recognised by its content) is read as bytes,
``CHUNK_BYTES`` at a time. The small top-level keys (``distributedInfo``,
``deviceProperties``, ...) are decoded whole with the stdlib decoder; the
``traceEvents`` array is cut into chunks at element boundaries and each chunk is
decoded by msgspec (a C decoder, 5 times faster than ``json.loads`` on a 217 MB
Kineto trace, with half the memory), typed or generic as the caller asks. So at no
time does the whole text, or every event as an object, sit in memory.

Where to cut: a chunk runs from the start of one element to a ``}`` followed by
``,`` and ``{`` (how Kineto separates its events). Wrapped in ``[ ]``, such a
chunk is valid JSON only if the ``}`` closes an element at the array's own depth:
inside a string or a nested value a quote or bracket stays open and the decoder
fails at the very end of the chunk. A cut that fails there is retried one
candidate earlier; a failure anywhere else is an error in the file itself.
Integers of any size decode exactly (msgspec), so ids past 64 bits neither
break nor corrupt a chunk.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import json
import re
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import msgspec

from commprof.traces.gunzip import GunzipReader

CHUNK_BYTES = 1 << 18
"""Bytes of JSON text decoded per chunk (256 KiB): a chunk's structs stay in the CPU's cache
through the reader's passes over them; smaller chunks cost a fixed time each."""
_CUT = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*\{")
"""What must follow an element's closing ``}`` for a cut there."""
_WS = re.compile(rb"[ \t\n\r]*")
_MAX_CUT_TRIES = 8
"""Cut candidates tried (each one decode) before the buffer is widened."""
_MAX_END_TRIES = 64
"""``]`` candidates tried for the array's end before the buffer is widened."""
_VALUE_WINDOW = 1 << 16
"""Bytes first tried for a top-level value; doubled until the value fits."""
NUM_PH_CHECKED = 100
"""A bare JSON array is a Chrome trace if one of its first items has a 'ph' field."""
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")

T = TypeVar("T")
_GENERIC = msgspec.json.Decoder()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _ByteStream:
    """A window of the file's bytes with a read position; reads on where a value crosses it."""

    def __init__(self, fh: BinaryIO, source: str, chunk_bytes: int, is_gzip: bool) -> None:
        self.fh, self.source, self.chunk_bytes, self.is_gzip = fh, source, chunk_bytes, is_gzip
        self.buf, self.pos, self.base, self.eof = b"", 0, 0, False
        self.control_chars_at: list[int] = []
        """Where a chunk read leniently held its first raw control character (byte offsets)."""

    def fill(self, num_bytes: int | None = None) -> None:
        """Append the next ``num_bytes`` (default one chunk) to the unread rest of the buffer."""
        try:
            data = self.fh.read(num_bytes or self.chunk_bytes)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise self.corrupt_gzip(exc) from exc
        except OSError as exc:
            if self.is_gzip:  # zlib errors surface as OSError on some Pythons
                raise self.corrupt_gzip(exc) from exc
            raise
        self.eof = not data
        self.base += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0

    def corrupt_gzip(self, exc: Exception) -> ValueError:
        return ValueError(f"{self.source}: truncated or corrupt gzip ({exc}); re-export the trace")

    def invalid(self, what: str, at: int | None = None) -> ValueError:
        return ValueError(
            f"{self.source}: not valid JSON, perhaps truncated ({what} at byte "
            f"{self.base + (self.pos if at is None else at)})"
        )

    def peek(self) -> str:
        """Skip whitespace; the next character, or "" at the end of the text."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return chr(self.buf[self.pos])
            if self.eof:
                return ""
            self.fill()

    def expect(self, chars: str) -> str:
        """Consume the next non-blank character, which must be one of ``chars``."""
        ch = self.peek()
        if not ch or ch not in chars:
            raise self.invalid(f"expected one of {chars!r}, found {ch or 'the end'!r}")
        self.pos += 1
        return ch

    def value(self) -> Any:
        """Decode the next whole JSON value (a top-level key or a small value), stdlib decoder."""
        if not self.peek():
            raise self.invalid("expected a value, found the end")
        decoder, window = json.JSONDecoder(), _VALUE_WINDOW
        while True:
            whole = self.pos + window >= len(self.buf)
            try:
                text, _ = codecs.utf_8_decode(
                    self.buf[self.pos : self.pos + window], "strict", whole and self.eof
                )
            except UnicodeDecodeError as exc:
                raise ValueError(f"{self.source}: not valid JSON, not UTF-8 text ({exc})") from exc
            try:
                obj, end = decoder.raw_decode(text)
                if end == len(text) and not (whole and self.eof):
                    raise json.JSONDecodeError("a number may go on", text, end)
            except json.JSONDecodeError as exc:
                if whole and self.eof:
                    raise self.invalid(exc.msg, self.pos + len(text[: exc.pos].encode())) from exc
                if whole:
                    self.fill()  # the value may go on past the buffer
                window *= 2
                continue
            self.pos += len(text[:end].encode())
            return obj

    def _decode(self, lo: int, hi: int, decode: Callable[[bytes], T]) -> T | None:
        """``decode`` of ``[`` + buf[lo:hi] + ``]``; None where the cut (hi) was wrong."""
        text = b"".join((b"[", memoryview(self.buf)[lo:hi], b"]"))
        try:
            return decode(text)
        except msgspec.DecodeError as exc:
            match = _ERROR_BYTE.search(str(exc))
            if match is None or int(match.group(1)) >= len(text) - 1:
                return None  # failed at the wrapper's ']' or ran out: the cut is wrong
            at = lo - 1 + int(match.group(1))
            if self.buf[at] >= 0x20:
                raise self.invalid(str(exc), at) from exc
            # A raw control character: invalid JSON anywhere, but inside a string it is what a
            # profiler writes for a garbled name. The stdlib's non-strict decoder reads those.
            try:
                chars = text.decode()
                values = json.loads(chars, strict=False, parse_constant=_no_constant)
            except json.JSONDecodeError as lenient:
                if lenient.pos >= len(chars) - 1:
                    return None  # the cut is wrong
                raise self.invalid(
                    lenient.msg, lo - 1 + len(chars[: lenient.pos].encode())
                ) from exc
            except ValueError as other:  # not UTF-8, or NaN / Infinity
                raise self.invalid(f"{other}", at) from exc
            self.control_chars_at.append(self.base + at)
            return decode(msgspec.json.encode(values))

    def _cut_chunk(self, decode: Callable[[bytes], T]) -> T | None:
        """Decode whole elements up to the last cut that works; None if none works."""
        hi = len(self.buf)
        for _ in range(_MAX_CUT_TRIES):
            close = self.buf.rfind(b"}", self.pos, hi)
            while close >= 0 and not _CUT.match(self.buf, close + 1):
                close = self.buf.rfind(b"}", self.pos, close)
            if close < 0:
                return None
            after = _CUT.match(self.buf, close + 1)
            got = self._decode(self.pos, close + 1, decode)
            if got is not None:
                self.pos = after.end() - 1  # type: ignore[union-attr]  # at the next '{'
                return got
            hi = close
        return None

    def _end_chunk(self, decode: Callable[[bytes], T]) -> T | None:
        """Decode the remaining elements up to the array's ']' and consume it; None if unseen."""
        close = self.pos - 1
        for num_tries in itertools.count():
            close = self.buf.find(b"]", close + 1)
            if close < 0 or (num_tries >= _MAX_END_TRIES and not self.eof):
                return None
            got = self._decode(self.pos, close, decode)
            if got is not None:
                self.pos = close + 1
                return got
        raise AssertionError("unreachable")  # pragma: no cover

    def items(self, decode: Callable[[bytes], T], on_chunk: Callable[[T], int]) -> int:
        """Feed the array just opened to ``on_chunk`` in decoded chunks; consume its ']'.

        Args:
            decode: Decodes a JSON array text (a chunk of whole elements).
            on_chunk: Takes one decoded chunk; returns its number of elements.

        Returns:
            The number of elements.
        """
        if self.peek() == "]":
            self.pos += 1
            return 0
        num_items, want = 0, self.chunk_bytes
        while True:
            while len(self.buf) - self.pos < want and not self.eof:
                self.fill(want)
            got = self._cut_chunk(decode)
            if got is not None:
                num_items += on_chunk(got)
                want = self.chunk_bytes
                continue
            got = self._end_chunk(decode)
            if got is not None:
                return num_items + on_chunk(got)
            if self.eof:
                raise self.invalid("no end of the traceEvents array")
            want = 2 * (len(self.buf) - self.pos) + 1  # wider: one element may be huge


def _open_bytes(path: Path) -> tuple[BinaryIO, bool]:
    with open(path, "rb") as fh:
        is_gzip = fh.read(2) == b"\x1f\x8b"
    if is_gzip:
        return GunzipReader(path), True  # type: ignore[return-value]  # read and closed only
    return open(path, "rb"), False  # closed by the caller


def generic_decode(data: bytes) -> list[Any]:
    """Decode a chunk into plain Python values (dicts, lists, exact ints)."""
    result: list[Any] = _GENERIC.decode(data)
    return result


def stream_chunks(
    path: Path | str,
    decode: Callable[[bytes], T],
    on_chunk: Callable[[T], int],
    *,
    chunk_bytes: int = CHUNK_BYTES,
    has_ph: Callable[[T], bool] | None = None,
    meta: dict[str, Any] | None = None,
    control_chars_at: list[int] | None = None,
) -> dict[str, Any]:
    """Read a Chrome trace, feeding the ``traceEvents`` array to ``on_chunk`` in chunks.

    Args:
        path: Trace file; gzip is recognised by content, not by the suffix.
        decode: Decodes the text of a JSON array of whole events (msgspec).
        on_chunk: Called once per decoded chunk, in file order; returns its number of events.
        chunk_bytes: Bytes of text decoded at a time (tests use tiny chunks).
        has_ph: For a bare JSON array (Chrome's JSON Array Format): whether a decoded
            chunk's first items carry 'ph' fields (else the file is not a trace).
        meta: Dict to fill with the other top-level keys as they are read (those before
            ``traceEvents`` are there when the first chunk arrives).
        control_chars_at: List to fill with the byte offset of the first raw control
            character in each chunk that held them inside strings (invalid JSON that a
            profiler writes for a garbled name); those chunks are read as the stdlib's
            non-strict decoder reads them.

    Returns:
        The other top-level keys of the trace (empty for a bare JSON array of events).

    Raises:
        ValueError: If the file is empty, truncated, not JSON or holds no events.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    p = Path(path)
    try:
        return _stream(p, decode, on_chunk, chunk_bytes, has_ph, meta, control_chars_at)
    except RecursionError:  # a value nested past the decoders' depth (json's, msgspec's)
        raise ValueError(
            f"{p}: JSON nested too deep to decode (past about {sys.getrecursionlimit()} "
            "levels): not a Kineto trace (its events nest a few levels deep)"
        ) from None


def _stream(
    p: Path,
    decode: Callable[[bytes], T],
    on_chunk: Callable[[T], int],
    chunk_bytes: int,
    has_ph: Callable[[T], bool] | None,
    meta: dict[str, Any] | None,
    control_chars_at: list[int] | None,
) -> dict[str, Any]:
    """:func:`stream_chunks` of an opened path (see there)."""
    fh, is_gzip = _open_bytes(p)
    with fh:
        st = _ByteStream(fh, str(p), chunk_bytes, is_gzip)
        if control_chars_at is not None:
            st.control_chars_at = control_chars_at
        first = st.peek()
        if not first:
            raise ValueError(f"{p}: empty file, not a trace")
        meta = {} if meta is None else meta
        num_events: int | None = None
        if first == "[":  # Chrome's JSON Array Format: a bare list of events
            st.pos += 1
            seen: list[bool] = []

            def checked(chunk: T) -> int:
                if not seen:
                    seen.append(has_ph is None or has_ph(chunk))
                return on_chunk(chunk)

            num_events = st.items(decode, checked)
            if num_events and not seen[0]:
                raise ValueError(f"{p}: JSON list without 'ph' fields, not a Chrome trace")
        elif first == "{":
            st.pos += 1
            num_events = _object_keys(st, decode, on_chunk, meta)
        else:
            meta[""] = st.value()  # valid JSON, but not an object or array
        if st.peek():
            raise st.invalid("extra data after the trace")
    if num_events is None:
        raise ValueError(f"{p}: JSON without a 'traceEvents' list, not a Chrome trace")
    if num_events == 0:
        raise ValueError(f"{p}: trace has no events")
    return meta


def _object_keys(
    st: _ByteStream,
    decode: Callable[[bytes], T],
    on_chunk: Callable[[T], int],
    meta: dict[str, Any],
) -> int | None:
    """Walk the top-level object (its '{' consumed): keys into ``meta``, events to ``on_chunk``."""
    num_events: int | None = None
    if st.peek() == "}":
        st.pos += 1
        return None
    while True:
        key = st.value()
        if not isinstance(key, str):
            raise st.invalid("expected a key string")
        st.expect(":")
        if key == "traceEvents" and st.peek() == "[":
            st.pos += 1
            num_events = st.items(decode, on_chunk)
            meta.pop(key, None)
        else:
            meta[key] = st.value()
        if st.expect(",}") == "}":
            return num_events


def _has_ph(chunk: list[Any]) -> bool:
    return any(isinstance(e, dict) and "ph" in e for e in chunk[:NUM_PH_CHECKED])


def stream_trace(
    path: Path | str, on_event: Callable[[Any], None], *, chunk_bytes: int = CHUNK_BYTES
) -> dict[str, Any]:
    """Read a Chrome trace, feeding each ``traceEvents`` item (plain values) to ``on_event``.

    Args:
        path: Trace file; gzip is recognised by content, not by the suffix.
        on_event: Called once per item of the events array (any JSON value), in file order.
        chunk_bytes: Bytes of text decoded at a time.

    Returns:
        The other top-level keys of the trace (empty for a bare JSON array of events).

    Raises:
        ValueError: If the file is empty, truncated, not JSON or holds no events.
    """

    def each(chunk: list[Any]) -> int:
        for item in chunk:
            on_event(item)
        return len(chunk)

    return stream_chunks(path, generic_decode, each, chunk_bytes=chunk_bytes, has_ph=_has_ph)


def load_trace(path: Path | str, *, chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    """Read a whole Chrome trace into a dict with ``traceEvents`` (small traces; tools).

    :func:`commprof.traces.trace_parser.parse_trace` reads files without this
    (chunked, typed, compact columns); this is for callers that want the events as dicts.

    Args:
        path: Trace file (``.json`` or gzip-compressed).
        chunk_bytes: Bytes of text decoded at a time.

    Returns:
        The decoded trace; a bare JSON array of events is wrapped as ``traceEvents``.

    Raises:
        ValueError: If the file is empty, truncated, not JSON or holds no events.
    """
    events: list[Any] = []
    meta = stream_trace(path, events.append, chunk_bytes=chunk_bytes)
    return {**meta, "traceEvents": events}
