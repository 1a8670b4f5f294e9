"""Every input judged before it is used (issue #44): each case the adversarial run found a
traceback, a hang or a silent wrong answer on is now a clean refusal (exit 2, or 3 for a folder
in use) in one line naming the file, key and value. Real files and real commands in this process
(nothing starts Ray: each refusal comes before it would)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from commprof import cli
from commprof.lock import DatasetLock, DatasetLocked, LockLost, parse_record
from commprof.outcomes import classify_error_texts
from commprof.reporting import viz
from commprof.sweeps import run_matrix
from tests.hang import GUARD_S

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden_gloo2"
SMOKE = DATA / "results_smoke"
BASE = "name: t\naxes:\n  model: [srn-100k]\n  world_size: [2]\n  bucket_cap_mb: [1]\n"
BIG = "9" * 400


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``commprof ARGV`` in this process: exit status and the lines on stderr (argparse's usage
    lines left out: its error is the last line)."""
    try:
        status = cli.main(argv)
    except SystemExit as done:  # argparse refused a flag
        status = int(done.code or 0)
    err = capsys.readouterr().err.strip().splitlines()
    return status, [line for line in err if line.startswith(("error", "commprof"))]


def _one_error(status: int, lines: list[str], *needles: str, rc: int = 2) -> None:
    assert status == rc, lines
    assert len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _matrix(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


# -- matrices and YAML --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (BASE.replace("[1]", f"[{BIG}]"), ["line 5", "400 digits"]),  # OverflowError before
        (BASE + f"run:\n  cell_timeout_s: {BIG}\n", ["line 7", "400 digits"]),
        (BASE + "description:\n  ? [a, b]\n  : 1\n", ["line 7", "is a list", "plain value"]),
        (BASE + "description:\n  ? {a: 1}\n  : 1\n", ["line 7", "is a mapping"]),
        # YAML merge keys are refused (not silently half-applied): write the keys out
        ("base: &b\n  model: [srn-100k]\n" + BASE + "  <<: *b\n", ["merge key (<<)", "line 8"]),
    ],
)
def test_matrix_values_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needles: list[str]
) -> None:
    path = _matrix(tmp_path, text)
    _one_error(*_cli(["check", str(path)], capsys), str(path), *needles)


@pytest.mark.parametrize(
    ("char", "code"),
    [("\\u2028", "U+2028"), ("\\u200b", "U+200B"), ("\\ufeff", "U+FEFF"), ("\\ud800", "U+D800")],
)  # a lone surrogate: libyaml refuses the escape itself (naming the line), else the env check
def test_invisible_or_unencodable_env_values_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], char: str, code: str
) -> None:
    path = _matrix(tmp_path, BASE + f'env:\n  NCCL_DEBUG: "IN{char}FO"\n')
    status, err = _cli(["check", str(path)], capsys)
    _one_error(status, err, str(path))
    assert ("env.NCCL_DEBUG" in err[0] and code in err[0]) or (
        code == "U+D800" and "line 7, column 20: found invalid Unicode" in err[0]
    ), err


def test_a_fifo_is_refused_before_it_is_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "m.yaml"
    os.mkfifo(fifo)  # opening it for reading would block until a writer came
    _one_error(*_cli(["check", str(fifo)], capsys), str(fifo), "not a regular file")


def test_a_megabyte_of_values_is_refused_before_parsing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = ",".join(["1"] * 520_000)  # 1 MiB: composing its nodes alone took 34 s
    path = _matrix(tmp_path, BASE.replace("[1]", f"[{values}]"))
    assert path.stat().st_size < 2**20
    _one_error(*_cli(["check", str(path)], capsys), str(path), "520,004 commas and lines")


def test_huge_numbers_in_only_are_refused_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _matrix(tmp_path, BASE)
    for term in (f"bucket_cap_mb={BIG}", f"steps={BIG}"):
        status = run_matrix.main(["--matrix", str(path), "--only", term, "--out", str(tmp_path)])
        err = capsys.readouterr().err.strip().splitlines()
        _one_error(status, err, "--only", "at most 19 digits")


def test_negative_repeat_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--repeat", "-5"]
    _one_error(*_cli([*argv, "--out", str(tmp_path / "o")], capsys), "repeat", "-5")
    assert not (tmp_path / "o").exists()


def test_a_missing_gloo_interface_is_deterministic(tmp_path: Path) -> None:
    # a real gloo process group asked for an interface this host does not have
    code = (
        "import os, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='0')\n"
        "try:\n"
        "    dist.init_process_group('gloo', rank=0, world_size=1, init_method='tcp://127.0.0.1:0')\n"
        "except Exception as e:\n"
        "    print(f'{type(e).__name__}: {e}')\n"
    )
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "commprof-no-such-if0"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=GUARD_S
    )
    text = done.stdout.strip()
    assert "commprof-no-such-if0" in text, done.stdout + done.stderr
    assert classify_error_texts([text]) == "deterministic"  # not run again as transient


# -- the lock file ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "kept"),
    [
        (b"\xff\xfe not utf-8", {}),
        (b'{"pid": 1, "started_unix_s": "yesterday"}', {"pid": 1}),
        (b'{"pid": 1, "started_unix_s": 1e300}', {"pid": 1}),
        (b'{"pid": 99999999999999999999, "host": ["h"]}', {}),
        (b"[1, 2]", {}),
        (b"[" * 100_000, {}),
    ],
)
def test_a_damaged_lock_record_reads_as_what_it_holds(data: bytes, kept: dict[str, Any]) -> None:
    assert parse_record(data) == kept


@pytest.mark.parametrize(
    "record", ['{"pid": PID, "host": "HOST", "started_unix_s": "yesterday"}',
               '{"pid": PID, "host": "HOST", "started_unix_s": 1e300}', "\udcff"],
)  # fmt: skip
def test_a_damaged_lock_file_of_a_live_owner_is_said_in_one_line(
    tmp_path: Path, record: str
) -> None:
    import socket

    text = record.replace("PID", str(os.getpid())).replace("HOST", socket.gethostname())
    (tmp_path / ".commprof.lock").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(DatasetLocked, match="is in use by another driver") as err:
        DatasetLock(tmp_path, wait_s=0).acquire()
    assert "\n" not in str(err.value)


def test_a_folder_where_the_lock_file_belongs_is_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ds" / ".commprof.lock").mkdir(parents=True)
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--out", str(tmp_path / "ds")]
    _one_error(*_cli(argv, capsys), ".commprof.lock is not a regular file", rc=3)


def test_a_dataset_folder_moved_away_stops_the_writer(tmp_path: Path) -> None:
    lock = DatasetLock(tmp_path / "ds")
    lock.acquire()
    try:
        os.replace(tmp_path / "ds", tmp_path / "moved")
        with pytest.raises(LockLost, match="the dataset folder is gone"), lock.writing():
            pytest.fail("wrote into a folder that was moved away")
    finally:
        lock.release()  # no traceback either


# -- analyze and its outputs --------------------------------------------------------------------


def _golden(tmp_path: Path, edit: Any = None) -> Path:
    """The golden two-rank gloo traces (uncompressed), each passed through ``edit``."""
    folder = tmp_path / "traces"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((GOLDEN / f"rank{rank}_steps2-4.json.gz").read_bytes()))
        if edit is not None:
            edit(doc)
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


def _each_x(change: Any) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        for e in doc["traceEvents"]:
            if e.get("ph") == "X":
                change(e)

    return edit


def test_a_400_digit_step_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def big_step(e: dict[str, Any]) -> None:
        if str(e["name"]).startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#" + BIG

    folder = _golden(tmp_path, _each_x(big_step))
    status, err = _cli(["analyze", str(folder)], capsys)
    assert status == 2 and err and all("step number of 400 digits" in line for line in err)


@pytest.mark.parametrize(
    ("key", "value", "kind"), [("pid", [1, 2], "list"), ("tid", {"a": 1}, "dict")]
)
def test_a_pid_or_tid_that_is_a_list_or_map_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: Any, kind: str
) -> None:
    folder = _golden(tmp_path, _each_x(lambda e: e.__setitem__(key, value)))
    status, err = _cli(["analyze", str(folder)], capsys)
    assert status == 2 and err and all(f"'{key}' is a {kind}" in line for line in err)


def test_events_repeated_1_ns_later_count_once(tmp_path: Path) -> None:
    from commprof.traces.analyze import analyze

    def shifted(doc: dict[str, Any]) -> None:
        copies = []
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") != "user_annotation":
                copies.append({**copy.deepcopy(e), "ts": e["ts"] + 0.001})  # 1 ns later
        doc["traceEvents"] += copies

    clean = analyze(_golden(tmp_path / "a"), workers=1)
    twice = analyze(_golden(tmp_path / "b", shifted), workers=1)
    assert len(twice.per_rank["collectives"]) == len(clean.per_rank["collectives"])
    assert (twice.per_rank["traces"]["num_duplicates"] > 0).all()
    assert any("duplicated events dropped" in n for n in twice.notes)
    assert twice.steps["comm_ns"].tolist() == clean.steps["comm_ns"].tolist()


def test_analyze_output_paths_are_checked_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out.json"
    folder.mkdir()
    _one_error(*_cli(["analyze", str(GOLDEN), "--perfetto", str(folder)], capsys), "is a folder")
    assert list(tmp_path.iterdir()) == [folder] and not list(folder.iterdir())  # no .tmp
    afile = tmp_path / "tables"
    afile.write_text("")
    _one_error(*_cli(["analyze", str(GOLDEN), "--out", str(afile)], capsys), "is a file")


# -- estimate ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "needles"),
    [
        ("numel: [1]", ["entry 0", "'numel'", "[1]"]),
        ("numel: 1e400", ["'numel'", "inf"]),
        ("numel: 1e23", ["'numel'", "1e+23"]),
        ("numel: 12.7", ["'numel'", "12.7"]),
        ("numel: 10, dtype_bytes: null", ["'dtype_bytes'", "None"]),
        (f"numel: {BIG}", ["line 1", "400 digits"]),
    ],
)
def test_parameter_file_entries_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: str, needles: list[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"- {{name: a, {entry}}}\n")
    argv = [
        "estimate",
        "--params-file",
        str(path),
        "--world-size",
        "2",
        "--interconnect",
        "nvlink4",
    ]
    _one_error(*_cli(argv, capsys), str(path), *needles)


def test_a_ten_megabyte_parameter_file_is_refused_before_parsing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("- {name: p, numel: 1, dtype_bytes: 4}\n" * 270_000)
    assert path.stat().st_size > 10 * 10**6
    argv = [
        "estimate",
        "--params-file",
        str(path),
        "--world-size",
        "2",
        "--interconnect",
        "nvlink4",
    ]
    _one_error(*_cli(argv, capsys), str(path), "commas and lines")


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--device-tflops", "inf"], ["--device-tflops", "'inf'"]),
        (["--world-size", "1000000000"], ["--world-size", "'1000000000'"]),
        (["--batch-tokens", BIG], ["--batch-tokens", "give at most"]),
    ],
)
def test_estimate_numbers_are_bounded(
    capsys: pytest.CaptureFixture[str], flags: list[str], needles: list[str]
) -> None:
    argv = ["estimate", "--model", "srn-1m", "--interconnect", "nvlink4"]
    if "--world-size" not in flags:
        argv += ["--world-size", "2"]
    _one_error(*_cli([*argv, *flags], capsys), *needles)


def test_estimate_fit_and_cell_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["estimate", "--model", "srn-1m", "--world-size", "2", "--fit"]
    _one_error(*_cli([*argv, str(SMOKE), "--cell", "zzz"], capsys), "--cell 'zzz' matches no cell")
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    _one_error(*_cli([*argv, str(text)], capsys), f"--fit {text}: neither a dataset folder")


def test_estimate_trace_refuses_two_traces_of_one_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a_rank0.json.gz", "b_rank0.json.gz"):
        shutil.copy(GOLDEN / "rank0_steps2-4.json.gz", tmp_path / name)
    shutil.copy(GOLDEN / "rank1_steps2-4.json.gz", tmp_path)
    argv = ["estimate", "--trace", str(tmp_path), "--interconnect", "nvlink4"]
    _one_error(*_cli(argv, capsys), "rank 0 step 2 appears in two traces")
    _one_error(*_cli(["analyze", str(tmp_path)], capsys), "rank 0 step 2 appears in two traces")


def test_non_finite_link_numbers_are_named_by_their_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from importlib import resources

    bundled = (
        resources.files("commprof.modeling.collective").joinpath("clusters.yaml").read_text("utf-8")
    )
    clusters = tmp_path / "c.yaml"
    clusters.write_text(bundled.replace("nic_bytes_per_s: 25.0e9", "nic_bytes_per_s: .inf", 1))
    argv = ["collective", "--cluster", str(clusters), "--world-size", "16"]
    _one_error(*_cli(argv, capsys), str(clusters), "nic_bytes_per_s", "inf")
    links = tmp_path / "l.yaml"
    links.write_text(
        "links:\n  - name: x\n    published_value: .inf\n    published_unit: GB/s\n"
        "    basis: per-direction\n"
    )
    argv = ["estimate", "--model", "srn-1m", "--world-size", "2", "--interconnect", "x"]
    _one_error(*_cli([*argv, "--interconnect-file", str(links)], capsys), "published_value", "inf")


# -- names drawn in the reports ------------------------------------------------------------------


def test_dollar_signs_in_names_are_drawn_as_text(tmp_path: Path) -> None:
    with viz.style():
        fig, (ax,) = viz.new_figure()
        ax.set_title(r"$\frac{$ and $x$")  # a ParseSyntaxException in mathtext, before
        fig.savefig(tmp_path / "f.svg")
    text = (tmp_path / "f.svg").read_text()
    assert "$x$" in text and r"$\frac{$" in text


@pytest.mark.slow
def test_commprof_run_with_its_folder_moved_away_exits_3(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--steps", "40", "--out", str(out)]
    run = subprocess.Popen(
        [sys.executable, "-m", "commprof", *argv], cwd=tmp_path, stderr=subprocess.PIPE, text=True
    )
    for _ in range(600):  # the folder is taken (the lock file written) before any rank starts
        if (out / ".commprof.lock").exists():
            break
        time.sleep(0.1)
    os.replace(out, tmp_path / "moved")  # while its ranks train
    _, err = run.communicate(timeout=GUARD_S)
    lines = [line for line in err.strip().splitlines() if line.startswith("error")]
    _one_error(run.returncode, lines, "the dataset folder is gone", rc=3)
    assert not out.exists()
