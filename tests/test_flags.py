"""The bounded flag types of ``commprof.flags``: every value in range is taken as given, every
other one refused with what to give instead (argparse prints it after the flag's name)."""

from __future__ import annotations

import argparse

import pytest

from commprof import flags


def test_bounded_int_takes_its_range_and_names_the_bound() -> None:
    ranks = flags.bounded_int(1 << 20, unit="ranks")
    assert (ranks("1"), ranks(str(1 << 20))) == (1, 1 << 20)
    with pytest.raises(argparse.ArgumentTypeError, match=r"give at most 1,048,576 ranks"):
        ranks(str((1 << 20) + 1))
    for text, said in (("0", "whole number >= 1"), ("-3", "whole number >= 1"), ("2.5", "not")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            ranks(text)


def test_bounded_float_takes_finite_numbers_in_its_range_only() -> None:
    tflops = flags.bounded_float(1e9, unit="TFLOP/s")
    assert (tflops("1e-3"), tflops("1e9")) == (1e-3, 1e9)
    for text in ("0", "-1", "nan", "inf", "1.5e9"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"give TFLOP/s in \(0, 1e\+09\]"):
            tflops(text)
    with pytest.raises(argparse.ArgumentTypeError, match="'fast' is not a number of TFLOP/s"):
        tflops("fast")


def test_the_shared_flags_are_built_from_the_bounded_types() -> None:
    from commprof.matrix import MAX_ATTEMPTS, MAX_TIMEOUT_S

    assert flags.seconds(str(MAX_TIMEOUT_S)) == MAX_TIMEOUT_S
    assert flags.wait_seconds("0") == 0.0
    assert flags.attempts(str(MAX_ATTEMPTS)) == MAX_ATTEMPTS
    with pytest.raises(argparse.ArgumentTypeError, match=f"give at most {MAX_ATTEMPTS:,}"):
        flags.attempts(str(MAX_ATTEMPTS + 1))
    with pytest.raises(argparse.ArgumentTypeError, match="give seconds in"):
        flags.seconds("nan")
