"""Bad input is refused before anything runs, with the file, key and value to change.

Matrix values (YAML 1.2 numbers, duplicate keys, NaN and infinite values, integers past their
column, files that are not UTF-8), timeout and count flags, and dataset folders that could not
take a commit. Nothing here starts Ray or a rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commprof import cli, matrix, results
from commprof.matrix import Cell, MatrixError
from commprof.sweeps import run_matrix

BASE = "name: t\naxes:\n  model: [srn-100k]\n  world_size: [2]\n  bucket_cap_mb: [1]\n"


def _load(tmp_path: Path, text: str) -> matrix.Matrix:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return matrix.load(path)


def test_exponents_without_a_dot_are_numbers(tmp_path: Path) -> None:
    m = _load(tmp_path, BASE + "run:\n  cell_timeout_s: 1e3\n  pg_timeout_s: 6E+1\n")
    assert (m.run.cell_timeout_s, m.run.pg_timeout_s) == (1000.0, 60.0)
    assert _load(tmp_path, BASE.replace("[1]", "[2.5e-1]")).cells[0].bucket_cap_mb == 0.25


def test_a_key_given_twice_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MatrixError, match=r"m\.yaml.*key 'world_size' is given twice \(lines 4"):
        _load(tmp_path, BASE + "  world_size: [4]\n")


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(BASE.encode() + b"description: caf\xe9\n")
    with pytest.raises(MatrixError, match=r"m\.yaml: the matrix file is not UTF-8 .*0xe9"):
        matrix.load(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BASE.replace("[1]", "[.nan]"), "bucket_cap_mb must be between 1 byte"),
        (BASE.replace("[1]", "[.inf]"), "bucket_cap_mb must be between 1 byte"),
        (BASE + "run:\n  cell_timeout_s: .nan\n", "run.cell_timeout_s must be a number"),
        (BASE + "run:\n  pg_timeout_s: .inf\n", "run.pg_timeout_s must be a number"),
        (BASE + "run:\n  pg_timeout_s: -1\n", "run.pg_timeout_s must be a number"),
        (BASE + "run:\n  max_attempts: 1000000\n", "run.max_attempts must be <= 100"),
        (BASE + "defaults:\n  steps: 1099511627776\n", "steps=1099511627776 is out of range"),
        (BASE.replace("[2]", "[4294967296]"), "world_size=4294967296 is out of range"),
    ],
)
def test_values_out_of_range(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(MatrixError, match=needle):
        _load(tmp_path, text)


def test_seed_may_use_its_64_bit_column() -> None:
    assert Cell(model="srn-100k", world_size=2, bucket_cap_mb=1, seed=2**40).seed == 2**40


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--run-timeout-s", "nan", "give seconds in"),
        ("--pg-timeout-s", "inf", "give seconds in"),
        ("--pg-timeout-s", "0", "give seconds in"),
        ("--pg-timeout-s", "soon", "is not a number of seconds"),
    ],
)
def test_timeout_flags(
    flag: str, value: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, flag, value])
    assert info.value.code == 2 and said in capsys.readouterr().err


def test_dataset_folder_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    plain.write_text("not a folder")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        results.check_writable(plain)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "cells").write_text("in the way")
    with pytest.raises(ValueError, match=r"ds/cells is a file where the dataset keeps a folder"):
        results.check_writable(tmp_path / "ds")
    assert results.check_writable(tmp_path / "new" / "ds").is_dir()  # created
    # the driver stops there, before Ray starts: exit 2 and the reason
    assert run_matrix.main(["--matrix", "smoke", "--out", str(plain)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert cli.main(["run", "--model", "srn-100k", "--world-size", "2", "--out", str(plain)]) == 2


def _trace(ts: float, args: dict[str, object]) -> dict[str, object]:
    return {
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
             "ts": 0.0, "dur": 100.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts,
             "dur": 5.0},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2,
             "ts": 10.0, "dur": 5.0, "args": args},
        ],
        "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 1},
    }  # fmt: skip


def test_trace_integers_of_any_size_and_timestamps_past_int64(tmp_path: Path) -> None:
    import json

    from commprof.traces.analyze import run
    from commprof.traces.trace_parser import parse_trace

    huge = {"Seq": 2**70, "In msg nelems": 2**70, "dtype": "Float"}
    parsed = parse_trace(_trace(1.0, huge))
    assert parsed.collectives["seq"].isna().all()  # past int64: unknown, not a traceback
    assert parsed.collectives["num_bytes"].isna().all()
    assert parse_trace(_trace(1.0, {"Seq": 7})).collectives["seq"].tolist() == [7]
    with pytest.raises(ValueError, match=r"end past what int64 nanoseconds hold.*'aten::mm'"):
        parse_trace(_trace(1e17, {}))
    (tmp_path / "rank0.json").write_text(json.dumps(_trace(1e17, {})))
    assert run(tmp_path, None, False, None) == 2  # streamed from the file: the same check
