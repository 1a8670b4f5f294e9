"""nccl-tests' JSON output (``-J``) read as its text: a real log written out the way nccl-tests'
``util.cu`` writes it (keys, ``%lf`` numbers, the root as ``%6i`` text, one device a process),
then read by both readers; broken files refused naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commprof.cli import main
from commprof.modeling.collective.nccl_log import read_log, read_logs

LOG = Path(__file__).parent / "data" / "nccl_tests" / "oci-bm-gpu4.8" / "all_reduce_p16_oke.txt"


def _half(fields: list[str]) -> dict[str, object]:
    time, algbw, busbw, wrong = fields
    return {
        "time": float(time),
        "alg_bw": float(algbw),
        "bus_bw": float(busbw),
        "nwrong": None if wrong == "N/A" else float(wrong),
    }


def _as_json(text: str, version: int = 3) -> dict[str, object]:
    """The JSON file nccl-tests -J writes for the run ``text`` printed (16 processes of one GPU;
    the table's rows split by whitespace, independently of the reader under test)."""
    devices = []
    results = []
    for line in text.splitlines():
        words = line.split()
        if line.startswith("#  Rank"):
            devices.append(
                {
                    "rank": int(words[2]),
                    "group": 0,
                    "pid": int(words[6]),
                    "hostname": words[8],
                    "device": int(words[10]),
                    "device_hex": words[11].strip("[]"),
                    "device_info": "A100",
                }
            )
        elif words and words[0].isdigit() and len(words) == 13:
            size, count, dtype, redop, root = words[:5]
            results.append(
                {
                    "size": int(size),
                    "count": int(count),
                    "type": dtype,
                    "redop": redop,
                    "root": f"{int(root):6d}",
                    "out_of_place": _half(words[5:9]),
                    "in_place": _half(words[9:13]),
                    "actual_iterations": 20,
                    "experiment_name": "",
                }
            )
    config = {
        "nthreads": 1,
        "ngpus": 1,
        "minimum_bytes": 8,
        "maximum_bytes": 8589934592,
        "step_factor": 2,
        "warmup_iters": 5,
        "iterations": 20,
        "validation": 1,
        "blocking_collectives": "false",
        "devices": devices,
    }
    return {
        "version": version,
        "start_time": "2026-12-07 10:00:00",
        "args": [
            "/opt/nccl-tests/build/all_reduce_perf",
            "-b",
            "8",
            "-e",
            "8G",
            "-f",
            "2",
            "-J",
            "out.json",
        ],
        "env": ["NCCL_DEBUG=WARN"],
        "nccl_version": 22304,
        "config": config,
        "results": results,
        "out_of_bounds": {"count": 0, "okay": "true"},
        "average_bus_bandwidth": {"bandwidth": 80.1, "okay": "unchecked"},
        "end_time": "2026-12-07 10:01:00",
    }


def _write(tmp_path: Path, data: object, name: str = "out.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=1))
    return path


def test_the_json_of_a_run_reads_as_its_text(tmp_path: Path) -> None:
    text = LOG.read_text()
    run = read_log(_write(tmp_path, _as_json(text))).run
    base = read_log(LOG).run
    assert (run.collective, run.world_size, run.num_hosts, run.complete) == (
        "all_reduce",
        16,
        2,
        True,
    )
    assert [(r.num_bytes, r.time_us, r.busbw_gbps, r.inplace_time_us) for r in run.rows] == [
        (r.num_bytes, r.time_us, r.busbw_gbps, r.inplace_time_us) for r in base.rows
    ]
    assert run.candidates == ("all_reduce",) and not run.inferred
    older = read_log(_write(tmp_path, _as_json(text, version=1), "v1.json")).run
    assert older.rows == run.rows


def test_one_process_of_eight_gpus_is_eight_ranks_and_the_table_names_the_test(
    tmp_path: Path,
) -> None:
    data = _as_json(LOG.read_text())
    config = data["config"]
    assert isinstance(config, dict)
    config["ngpus"], config["devices"] = 8, config["devices"][::8]  # -g 8: a device a process
    data["args"] = ["./a.out"]  # a renamed binary: the table still says all_reduce
    run = read_log(_write(tmp_path, data)).run
    assert (run.world_size, run.num_hosts) == (16, 2)
    assert run.collective == "all_reduce" and run.inferred


def test_wrong_zero_byte_and_unvalidated_records(tmp_path: Path) -> None:
    data = _as_json(LOG.read_text())
    results = data["results"]
    assert isinstance(results, list)
    results[3]["out_of_place"]["nwrong"] = 12.0  # corrupted data: never fitted
    results[0]["size"] = 0
    for r in results[4:]:
        r["out_of_place"]["nwrong"] = r["in_place"]["nwrong"] = None  # -c 0: not validated
    run = read_log(_write(tmp_path, data)).run
    assert [(s.line, s.kind) for s in run.skipped] == [(1, "0 bytes"), (4, "#wrong")]
    assert len(run.rows) == len(results) - 2


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t[: len(t) // 2],
            r"out\.json: not valid JSON \(Input data was truncated\).*give its text",
        ),
        (lambda t: t.replace('"size": 1048576', '"size": "1M"'), r"\$\.results\[\d+\]\.size"),
        (lambda t: t.replace('"config"', '"konfig"'), r"missing required field `config`"),
        (lambda t: t.replace('"bus_bw": 0.0,', '"bus_bw": "nan",', 1), r"'nan', not a number"),
    ],
)
def test_a_broken_file_is_refused_naming_file_and_field(
    tmp_path: Path, edit: object, message: str
) -> None:
    path = _write(tmp_path, _as_json(LOG.read_text()))
    assert callable(edit)
    path.write_text(edit(path.read_text()))
    with pytest.raises(ValueError, match=message):
        read_logs([path])


def test_collective_fits_a_json_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _as_json(LOG.read_text()))
    argv = ["collective", "--cluster", "oci-bm-gpu4.8", "--world-size", "16", "--json"]
    assert main([*argv, "--fit", str(path)]) == 0
    from_json = json.loads(capsys.readouterr().out)
    assert main([*argv, "--fit", str(LOG)]) == 0
    assert from_json == json.loads(capsys.readouterr().out)
