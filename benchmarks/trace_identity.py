"""Check that a change to the trace reader keeps every output: digests of parse_trace's fields.

Writes, per trace, a JSON of every field of the :class:`ParsedTrace` (scalars as they are,
arrays and table columns as dtype, length and a SHA-256 of their values, the tables' column
order and categories included), so the digests of one tree can be saved before a change and
compared after it, field by field, without keeping the old code.

Usage::

    python benchmarks/trace_identity.py --save /tmp/before TRACE...     # before the change
    python benchmarks/trace_identity.py --check /tmp/before TRACE...    # after: 0 when equal
    python benchmarks/trace_identity.py --check /tmp/before --chunk-bytes 4096 TRACE...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from commprof.traces.intervals import IntervalSet
from commprof.traces.trace_parser import ParsedTrace, parse_trace


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _array(a: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(a.dtype), "len": int(a.size), "sha": _sha(json.dumps(a.tolist()))}


def _frame(df: pd.DataFrame | None) -> dict[str, Any] | None:
    if df is None:
        return None
    out: dict[str, Any] = {"columns": list(map(str, df.columns)), "len": len(df),
                           "index": _sha(json.dumps(df.index.tolist(), default=repr))}  # fmt: skip
    for col in df.columns:
        s = df[col]
        one: dict[str, Any] = {"dtype": str(s.dtype)}
        if isinstance(s.dtype, pd.CategoricalDtype):
            one["categories"] = _sha(json.dumps(list(s.cat.categories), default=repr))
            one["codes"] = _sha(json.dumps(s.cat.codes.tolist()))
        values = [None if v is pd.NA else v for v in s.astype(object).tolist()]
        one["values"] = _sha(json.dumps(values, default=repr))
        one["types"] = sorted({type(v).__name__ for v in values})
        out[str(col)] = one
    return out


FRAMES = frozenset({"collectives", "counted", "possible_comm", "possible_ranges"})


def digest(parsed: ParsedTrace) -> dict[str, Any]:
    """Every field of ``parsed``, as comparable JSON."""
    out: dict[str, Any] = {}
    for name in ParsedTrace.__slots__:
        value = getattr(parsed, name)
        if isinstance(value, np.ndarray):
            out[name] = _array(value)
        elif isinstance(value, pd.DataFrame) or name in FRAMES:
            out[name] = _frame(value)
        elif isinstance(value, dict):
            out[name] = {
                k: {"starts": _array(v.starts), "ends": _array(v.ends)}
                for k, v in value.items()
                if isinstance(v, IntervalSet)
            } | {"keys": list(value)}
        else:
            out[name] = value if not isinstance(value, tuple) else list(value)
    return out


def _key(path: Path) -> str:
    return _sha(str(path.resolve()))[:16] + "_" + path.name.replace(".", "_") + ".json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", type=Path)
    mode.add_argument("--check", type=Path)
    ap.add_argument("--chunk-bytes", type=int, default=None)
    ap.add_argument("traces", type=Path, nargs="+")
    args = ap.parse_args(argv)
    kw = {} if args.chunk_bytes is None else {"chunk_bytes": args.chunk_bytes}
    bad = 0
    for trace in args.traces:
        got = json.loads(json.dumps(digest(parse_trace(trace, **kw)), default=repr))
        file = (args.save or args.check) / _key(trace)
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            file.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            continue
        want = json.loads(file.read_text(encoding="utf-8"))
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        bad += bool(diff)
        print(f"{'DIFFERS' if diff else 'same'} {trace}" + (f": {diff}" if diff else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
