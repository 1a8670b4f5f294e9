"""Collective args as table columns: each collective's own args over its launching op's
(:class:`MergedArgs`), and the columns made of them (message bytes, integers, text).

Collective metadata in the event args (``Collective name``, ``Process Group Name``, ``Seq``,
``In msg nelems``, ``dtype``) is kept by the reader for the few events a rule needs it of
(:mod:`commprof.traces.kept_args`); a collective kernel's own args come first, its launching op's
(``record_param_comms``) fill the keys they lack. Each column is made at once where its values
are the usual ones (all integers, all strings), value by value only where they are not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import compress, repeat
from operator import is_
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from commprof.traces.kept_args import ABSENT, KeptArgs, absent
from commprof.traces.trace_rules import DTYPE_BYTES


def _dtype_bytes(name: Any) -> int | None:
    return DTYPE_BYTES.get(str(name).lower()) if name is not None else None


INT64_MAX = 2**63 - 1


def _int64(value: Any) -> int | None:
    """An integer arg as the tables hold it: None where it is no integer or is past int64.

    JSON integers have no size limit (``Seq`` of 2**70 parses); a column of int64 does, and no
    real sequence number or message size comes near it, so such a value counts as unknown.
    """
    if isinstance(value, int) and not isinstance(value, bool) and -INT64_MAX <= value <= INT64_MAX:
        return value
    return None


def _message_bytes(args: dict[str, Any] | None) -> int | None:
    # Collective metadata (NCCL kernels, record_param_comms) first, then the
    # input shape that record_shapes=True attaches to gloo annotations.
    if not args:
        return None
    nelems, size = args.get("In msg nelems"), _dtype_bytes(args.get("dtype"))
    if isinstance(nelems, int) and size is not None:
        return _int64(nelems * size)
    dims, types = args.get("Input Dims"), args.get("Input type")
    if dims and types and isinstance(dims[0], list):
        size = _dtype_bytes(types[0])
        if size is not None and all(isinstance(d, int) for d in dims[0]):
            return _int64(math.prod(dims[0]) * size)
    return None


def first_codes(values: list[Any], dtype: type) -> tuple[npt.NDArray[Any], list[Any]]:
    """Codes of hashable values in order of first appearance, and the distinct values (TypeError
    if one is unhashable): one pass in C, each value ``setdefault`` with the count so far."""
    code: dict[Any, int] = {}
    codes: npt.NDArray[Any] = np.fromiter(
        map(code.setdefault, values, map(len, repeat(code))), dtype, len(values)
    )
    return codes, list(code)


def _category(values: list[str]) -> pd.Categorical:
    """A column of few distinct strings, from their codes: one string object per distinct
    value (a string column of a million collectives costs a pyarrow string each)."""
    codes, distinct = first_codes(values, np.int32)
    return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))


def text_category(values: list[Any]) -> pd.Categorical:
    """``_category`` of the values as strings; the usual column, all strings already, coded
    as it is (no ``str`` of each value)."""
    try:
        codes, distinct = first_codes(values, np.int32)
    except TypeError:  # an unhashable value (a list)
        return _category(list(map(str, values)))
    if all(type(d) is str for d in distinct):  # so every value is (decoded JSON)
        return pd.Categorical.from_codes(codes, categories=pd.Index(distinct, dtype=object))
    return _category(list(map(str, values)))


def int_column(values: list[Any]) -> pd.api.extensions.ExtensionArray:
    """An Int64 column of integer args, NA where a value is no integer or is past int64
    (:func:`_int64`); the usual all-integer case in one numpy conversion."""
    if values and set(map(type, values)) == {int}:
        try:
            return pd.array(np.array(values, dtype=np.int64), dtype="Int64")
        except OverflowError:
            pass
    return pd.array([_int64(v) for v in values], dtype="Int64")


def bytes_column(
    nelems: list[Any], dtypes: list[Any], row: Callable[[int], dict[str, Any]]
) -> pd.api.extensions.ExtensionArray:
    """The num_bytes column (:func:`_message_bytes` of each row, ``row(i)`` its args):
    ``In msg nelems`` times the size of ``dtype`` at once where both are known, each other row
    on its own."""
    try:
        dtype_code, distinct = first_codes(dtypes, np.intp)
    except TypeError:  # an unhashable dtype
        return pd.array([_message_bytes(row(i)) for i in range(len(nelems))], dtype="Int64")
    size_of = {d: _dtype_bytes(d) for d in distinct}
    if set(map(type, nelems)) == {int} and None not in size_of.values():
        # the usual case, at once in numpy: every row an integer count of a known dtype
        try:
            n = np.array(nelems, np.int64)
        except OverflowError:
            n = None
        if n is not None and ((n > -(2**40)) & (n < 2**40)).all():
            size = np.array(list(size_of.values()), np.int64)[dtype_code]
            return pd.arrays.IntegerArray(n * size, np.zeros(n.size, bool))
    sizes = list(map(size_of.__getitem__, dtypes))
    ok = [
        type(n) is int and z is not None and abs(n) < 2**40
        for n, z in zip(nelems, sizes, strict=True)
    ]
    out: list[int | None] = [
        n * z if good else None  # type: ignore[operator]  # good: both are ints
        for n, z, good in zip(nelems, sizes, ok, strict=True)
    ]
    for i in [i for i, good in enumerate(ok) if not good]:
        out[i] = _message_bytes(row(i))
    return pd.array(out, dtype="Int64")


class MergedArgs:
    """Each collective's args: its own over its launching op's (``{**op, **own}``), read a key
    column at a time from the kept args' columns (a numpy ``take`` of each); no merged dict is
    built but for the rare row that needs all of it, and the ops' values are read only where the
    own args lack the key."""

    def __init__(self, kept: KeptArgs, own: npt.NDArray[np.intp], op: npt.NDArray[np.intp]) -> None:
        self._kept = kept
        self.own_rows, self.op_rows = kept.rows(own), kept.rows(op)
        """Each collective's row in the kept args, and its launching op's (-1: none)."""
        self.any_own = bool((self.own_rows >= 0).any())
        self.any_ops = bool((self.op_rows >= 0).any())

    def __len__(self) -> int:
        return int(self.own_rows.size)

    def own(self, key: str) -> list[Any]:
        """The own args' value of ``key`` of each row (``ABSENT`` where they lack it)."""
        return self._kept.column(key, self.own_rows)

    def op(self, key: str) -> list[Any]:
        """The launching op's value of ``key`` of each row (``ABSENT`` where none holds it)."""
        return self._kept.column(key, self.op_rows)

    def values(self, key: str, default: Any = None) -> list[Any]:
        """The merged ``get(key, default)`` of each row: the own args' value, where they hold
        the key, else the op's."""
        out, gaps = self.held(key)
        for i in gaps:
            out[i] = default
        return out

    def held(self, key: str) -> tuple[list[Any], list[int]]:
        """``values(key, ABSENT)`` and the rows whose merged args lack the key."""
        if not self.any_own:  # RCCL, symmetric memory: no kernel carries metadata
            out = self.op(key)
            return out, absent(out)
        out = self.own(key)
        gaps = absent(out)
        if gaps and self.any_ops:
            fill = self._kept.column(key, self.op_rows[gaps])
            for i, value in zip(gaps, fill, strict=True):
                out[i] = value
            gaps = list(compress(gaps, map(is_, fill, repeat(ABSENT))))
        return out, gaps

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i``'s merged args."""
        return {**self._kept.at(int(self.op_rows[i])), **self._kept.at(int(self.own_rows[i]))}
