"""Streaming Chrome / Kineto trace reader: bounded memory on traces of millions of events.

A trace file (``.json``, or gzip recognised by its content) is read in chunks of
text (``CHUNK_CHARS``). The small top-level keys (``distributedInfo``,
``deviceProperties``, ...) are decoded whole; the ``traceEvents`` array is decoded
one item at a time with ``json.JSONDecoder().raw_decode`` (the C scanner) and
handed to a callback, so at no time does the whole text, or every event as a
dict, sit in memory (:mod:`commprof.profiling.trace_columns` keeps compact
columns of them).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

CHUNK_CHARS = 1 << 22
"""Characters read per chunk (4 Mi); the reader holds at most about 1.25 chunks of text."""
_WS = re.compile(r"[ \t\n\r]*")
_TAIL_CHARS = 16
"""A decode error this close to the buffer end may be a token cut by the chunk boundary
(the longest, ``-Infinity``, has 9 characters)."""
_NUM_PH_CHECKED = 100
"""A bare JSON array is a Chrome trace if one of its first items has a 'ph' field."""


class _TextStream:
    """Incremental JSON tokens over a text file: whitespace, punctuation, whole values."""

    def __init__(self, fh: TextIO, source: str, chunk_chars: int, is_gzip: bool) -> None:
        self.fh, self.source, self.chunk_chars, self.is_gzip = fh, source, chunk_chars, is_gzip
        self.lookahead = max(chunk_chars // 4, 1)
        self.buf, self.pos, self.base, self.eof = "", 0, 0, False
        self.decode = json.JSONDecoder().raw_decode

    def fill(self) -> None:
        """Append the next chunk to the unread rest of the buffer."""
        try:
            data = self.fh.read(self.chunk_chars)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(
                f"{self.source}: truncated or corrupt gzip ({exc}); re-export the trace"
            ) from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.source}: not valid JSON, not UTF-8 text ({exc})") from exc
        except OSError as exc:
            if self.is_gzip:  # zlib errors surface as OSError on some Pythons
                raise ValueError(
                    f"{self.source}: truncated or corrupt gzip ({exc}); re-export the trace"
                ) from exc
            raise
        self.eof = not data
        self.base += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0

    def invalid(self, what: str) -> ValueError:
        return ValueError(
            f"{self.source}: not valid JSON, perhaps truncated ({what} at character "
            f"{self.base + self.pos})"
        )

    def peek(self) -> str:
        """Skip whitespace; the next character, or "" at the end of the text."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
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
        """Decode the next whole JSON value, reading on where it crosses the buffer end."""
        if not self.peek():
            raise self.invalid("expected a value, found the end")
        while True:
            if len(self.buf) - self.pos < self.lookahead and not self.eof:
                self.fill()
            try:
                obj, end = self.decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                # Cut by the buffer end (an open string, or a token at the very end):
                # read on. Anywhere else the text itself is wrong.
                cut = exc.pos >= len(self.buf) - _TAIL_CHARS or exc.msg.startswith("Unterminated")
                if self.eof or not cut:
                    self.pos = exc.pos
                    raise self.invalid(exc.msg) from exc
                self.fill()
                continue
            if end == len(self.buf) and not self.eof:  # a number may go on in the next chunk
                self.fill()
                continue
            self.pos = end
            return obj

    def items(self, on_item: Callable[[Any], None]) -> tuple[int, bool]:
        """Feed each item of the array just opened to ``on_item``; consume the ']'.

        Returns:
            (number of items, whether one of the first items has a 'ph' field).
        """
        num_items, has_ph = 0, False
        if self.peek() == "]":
            self.pos += 1
            return 0, False
        while True:
            item = self.value()
            if num_items < _NUM_PH_CHECKED and not has_ph:
                has_ph = isinstance(item, dict) and "ph" in item
            on_item(item)
            num_items += 1
            if self.expect(",]") == "]":
                return num_items, has_ph


def _open_text(path: Path) -> tuple[TextIO, bool]:
    with open(path, "rb") as fh:
        is_gzip = fh.read(2) == b"\x1f\x8b"
    if is_gzip:
        return gzip.open(path, "rt", encoding="utf-8"), True
    return open(path, encoding="utf-8"), False  # closed by the caller


def stream_trace(
    path: Path | str, on_event: Callable[[Any], None], *, chunk_chars: int = CHUNK_CHARS
) -> dict[str, Any]:
    """Read a Chrome trace, feeding each ``traceEvents`` item to ``on_event`` in file order.

    Args:
        path: Trace file; gzip is recognised by content, not by the suffix.
        on_event: Called once per item of the events array (any JSON value).
        chunk_chars: Characters read at a time (tests use tiny chunks).

    Returns:
        The other top-level keys of the trace (empty for a bare JSON array of events).

    Raises:
        ValueError: If the file is empty, truncated, not JSON or holds no events.
    """
    if chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1, got {chunk_chars}")
    p = Path(path)
    fh, is_gzip = _open_text(p)
    with fh:
        st = _TextStream(fh, str(p), chunk_chars, is_gzip)
        first = st.peek()
        if not first:
            raise ValueError(f"{p}: empty file, not a trace")
        meta: dict[str, Any] = {}
        num_events: int | None = None
        if first == "[":  # Chrome's JSON Array Format: a bare list of events
            st.pos += 1
            num_events, has_ph = st.items(on_event)
            if num_events and not has_ph:
                raise ValueError(f"{p}: JSON list without 'ph' fields, not a Chrome trace")
        elif first == "{":
            st.pos += 1
            if st.peek() == "}":
                st.pos += 1
            else:
                while True:
                    key = st.value()
                    if not isinstance(key, str):
                        raise st.invalid("expected a key string")
                    st.expect(":")
                    if key == "traceEvents" and st.peek() == "[":
                        st.pos += 1
                        num_events, _ = st.items(on_event)
                        meta.pop(key, None)
                    else:
                        meta[key] = st.value()
                    if st.expect(",}") == "}":
                        break
        else:
            meta = {"": st.value()}  # valid JSON, but not an object or array
        if st.peek():
            raise st.invalid("extra data after the trace")
    if num_events is None:
        raise ValueError(f"{p}: JSON without a 'traceEvents' list, not a Chrome trace")
    if num_events == 0:
        raise ValueError(f"{p}: trace has no events")
    return meta


def load_trace(path: Path | str, *, chunk_chars: int = CHUNK_CHARS) -> dict[str, Any]:
    """Read a whole Chrome trace into a dict with ``traceEvents`` (small traces; tools).

    :func:`commprof.profiling.trace_parser.parse_trace` reads files without this
    (streaming, compact columns); this is for callers that want the events as dicts.

    Args:
        path: Trace file (``.json`` or gzip-compressed).
        chunk_chars: Characters read at a time.

    Returns:
        The decoded trace; a bare JSON array of events is wrapped as ``traceEvents``.

    Raises:
        ValueError: If the file is empty, truncated, not JSON or holds no events.
    """
    events: list[Any] = []
    meta = stream_trace(path, events.append, chunk_chars=chunk_chars)
    return {**meta, "traceEvents": events}
