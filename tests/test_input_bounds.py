"""Inputs are bounded before any work: the matrix file's size, its aliases and values, its cell
count and repeats, caps within what DDP takes, env values, names that make folder names,
microbenchmark sizes. Each refusal is one line naming the file and key, a non-zero exit, within
bounded memory and before Ray starts (these cases ran for minutes, took gigabytes, or failed in
the ranks before).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from commprof import cli, matrix
from commprof.matrix import MatrixError
from commprof.sweeps import run_matrix
from commprof.sweeps.guard import GuardPlan
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
BASE = "name: t\naxes:\n  model: [srn-100k]\n  world_size: [2]\n  bucket_cap_mb: [1]\n"


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "m.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


PEAK_BYTES = 64 << 20
"""Most memory ``commprof check`` of a refused matrix may allocate (once its modules are
imported): every unbounded case here took gigabytes (and minutes) before."""


@pytest.fixture(scope="module", autouse=True)
def _imported(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``commprof check`` of a good matrix once, so that the modules it imports are not counted
    in the first measured case's memory."""
    path = tmp_path_factory.mktemp("good") / "m.yaml"
    path.write_text(BASE)
    cli.main(["check", str(path)])


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, int]:
    """``commprof check MATRIX`` in this process: exit status, stderr and the most bytes it had
    allocated at once (``tracemalloc``: the same on any host, however busy)."""
    tracemalloc.start()
    try:
        status = cli.main(["check", str(path)])
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return status, capsys.readouterr().err, peak_bytes


def _bomb(depth: int = 9, width: int = 9) -> str:
    """A matrix of about 500 bytes whose model axis is an alias expanding to width**depth
    values (the anchors sit in ``description``, which takes anything)."""
    names = [f"l{i}" for i in range(depth)]
    lines = ["description:", f"  {names[0]}: &{names[0]} [{', '.join(['x'] * width)}]"]
    for prev, name in itertools.pairwise(names):
        lines.append(f"  {name}: &{name} [{', '.join(['*' + prev] * width)}]")
    return "\n".join(lines) + "\n" + BASE.replace("model: [srn-100k]", f"model: *{names[-1]}")


@pytest.mark.parametrize(
    ("text", "needle", "key"),
    [
        # a 500-byte alias bomb (9 x 9) in a matrix value: ran 54 s, 5.8 GB, then MemoryError
        (_bomb(), "aliases", "line"),
        (BASE + "description: &a [*a]\n", "refers to the value that holds it", "line 6"),
        # a value of the wrong type is quoted by a short prefix only, however large it is
        (BASE.replace("[2]", "[" + "x" * 200_000 + "]"), "is a str, expected int", "axes"),
        (BASE + "repeats: 100000000\n", "'repeats' must be in [1, 1,000]", "repeats"),
        (
            BASE.replace("[2]", "[" + ", ".join(str(n) for n in range(2, 202)) + "]")
            + "  batch_size: ["
            + ", ".join(str(n) for n in range(1, 101))
            + "]\n",
            "expands to 20,000 cells",
            "axes",
        ),
        (BASE.replace("[1]", "[1e-300]"), "must be between 1 byte", "bucket_cap_mb"),
        (BASE.replace("[1]", "[1e300]"), "must be between 1 byte", "bucket_cap_mb"),
        (BASE.replace("[1]", "[1e308]"), "must be between 1 byte", "bucket_cap_mb"),
        (BASE.replace("[1]", "[.inf]"), "must be between 1 byte", "bucket_cap_mb"),
        (
            BASE + 'env:\n  NCCL_DEBUG: "IN\\0FO"\n',
            "control or invisible character (U+0000 at position 2)",
            "env.NCCL_DEBUG",
        ),
        (
            BASE + 'env:\n  NCCL_DEBUG: "INFO\\n"\n',
            "control or invisible character (U+000A at position 4)",
            "env.NCCL_DEBUG",
        ),
        (BASE.replace("name: t", 'name: "t\\n"'), "must be up to 100 letters", "'name'"),
        (BASE.replace("name: t", "name: " + "t" * 101), "must be up to 100 letters", "'name'"),
        (BASE + "microbench:\n  sizes_bytes: [10000000000000, 1024, 4096]\n", "1 TiB", "sizes"),
        (BASE + "microbench:\n  sizes_bytes: [65536]\n", "1 distinct size(s)", "microbench"),
        (
            BASE + "microbench:\n  min_bytes: 1\n  max_bytes: 1099511627776\n",
            "41 sizes",
            "'microbench'",
        ),
    ],
    ids=[
        "alias-bomb",
        "recursive-alias",
        "huge-value",
        "repeats",
        "cell-count",
        "cap-1e-300",
        "cap-1e300",
        "cap-1e308",
        "cap-inf",
        "env-nul",
        "env-newline",
        "name-newline",
        "name-long",
        "microbench-10TB",
        "microbench-one-size",
        "microbench-too-many",
    ],
)
def test_a_bad_matrix_is_one_line_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str, key: str
) -> None:
    path = _write(tmp_path, text)
    status, err, peak_bytes = _check(path, capsys)
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(path) in err, err[:2000]
    assert needle in err and key in err, err[:2000]
    assert len(err) < 1000  # a short quote of the value, never the value
    assert peak_bytes < PEAK_BYTES  # bounded before anything is built (unbounded: gigabytes)


def test_a_large_matrix_file_is_refused_before_it_is_parsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 50 MB matrix took 180 s and 5.5 GB: refused by its size, reading 1 MiB and a byte
    path = _write(tmp_path, BASE + "description: |\n" + "  padding\n" * 5_000_000)
    status, err, peak_bytes = _check(path, capsys)
    assert status == 2 and "is larger than 1,048,576 bytes" in err and str(path) in err
    assert peak_bytes < 8 << 20  # 1 MiB and a byte read, not the 50 MB file (parsed: 5.5 GB)


def test_bounds_hold_at_their_edges(tmp_path: Path) -> None:
    one_byte, one_tib = 2.0**-20, 2.0**20
    caps = f"[{one_byte!r}, {one_tib!r}, null]"
    m = matrix.load(_write(tmp_path, BASE.replace("[1]", caps) + "repeats: 3\n"))
    assert sorted({c.bucket_cap_mb or 0 for c in m.cells}) == [0, one_byte, one_tib]
    assert len(m.cells) == 9
    name = "n" * 100
    m = matrix.load(_write(tmp_path, BASE.replace("name: t", f"name: {name}")))
    assert m.name == name
    env = BASE + 'env:\n  NCCL_DEBUG: "INFO"\n  NCCL_SOCKET_IFNAME: "^docker0,lo"\n'
    assert matrix.load(_write(tmp_path, env)).env["NCCL_SOCKET_IFNAME"] == "^docker0,lo"
    anchors = BASE + "defaults: &d\n  steps: 4\nrun: {}\n"  # an alias that stays small is fine
    assert matrix.load(_write(tmp_path, anchors)).cells[0].steps == 4


def test_caps_on_the_command_line_are_bounded_alike(capsys: pytest.CaptureFixture[str]) -> None:
    for cap in ("1e-300", "1e300", "1e308", "inf", "nan"):
        argv = ["run", "--model", "srn-100k", "--world-size", "2", "--out", "unused"]
        with pytest.raises(SystemExit) as info:
            cli.main([*argv, "--bucket-cap-mb", cap])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "must be between 1 byte" in err, err


def test_the_guard_costs_the_microbenchmark_buffers(tmp_path: Path) -> None:
    # 64 GiB of all-reduce on a rank: within the matrix's bounds, over any 2-core host's memory
    text = BASE + "microbench:\n  sizes_bytes: [1024, 65536, 68719476736]\n"
    m = matrix.load(_write(tmp_path, text))
    decision = GuardPlan(m).decide(m.cells[0])
    assert not decision.feasible and "host" in decision.rejected_pools
    assert "microbench buffers (10 x largest size 64 GiB)" in decision.explain()
    small = matrix.load(_write(tmp_path, BASE))
    assert GuardPlan(small).decide(small.cells[0]).feasible


def test_the_driver_refuses_a_bad_matrix_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    connects: list[object] = []  # the driver reaches Ray only through connect()
    monkeypatch.setattr(run_matrix, "connect", lambda *a, **k: connects.append(a))
    path = _write(tmp_path, BASE.replace("[1]", "[1e-300]"))  # a ZeroDivisionError in the guard
    assert run_matrix.main(["--matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bucket_cap_mb must be between 1 byte" in err and err.count("\n") == 1
    assert not connects  # refused before Ray: it had started Ray before
    assert not (tmp_path / "out").exists()


def test_a_nul_in_env_is_refused_by_the_sweep_command(tmp_path: Path) -> None:
    # before, every gang failed to start for about 200 s, the variable never named
    path = _write(tmp_path, BASE + 'env:\n  GLOO_SOCKET_IFNAME: "lo\\0"\n')
    done = subprocess.run(
        [sys.executable, "-m", "commprof", "sweep", "--matrix", str(path), "--out", "o"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {path}: key 'env.GLOO_SOCKET_IFNAME': the value holds a control or invisible "
        "character (U+0000 at position 2); an environment value is one line of printable text"
    ]


def test_matrix_errors_are_matrix_errors(tmp_path: Path) -> None:
    with pytest.raises(MatrixError):
        matrix.load(_write(tmp_path, BASE + "repeats: 0\n"))
