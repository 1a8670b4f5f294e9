"""The nccl-tests reader on real public logs and on broken ones; calibration; the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commprof.cli import main
from commprof.modeling.collective.calibration import calibrate
from commprof.modeling.collective.calibration_fit import DESCRIPTION
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.fitted_model import predict
from commprof.modeling.collective.nccl_tests import parse_text, read_log

DATA = Path(__file__).parent / "data" / "nccl_tests"


def test_reads_every_kept_log() -> None:
    expected = {
        "oci-bm-gpu4.8/all_reduce_p16_oke.txt": (16, 2, 31),
        "gh200-alps/all_reduce_p8.txt": (8, 2, 25),  # indented in its page, as kept
        "gh200-olivia/all_reduce_p8_int8.txt": (8, 2, 28),
        "aws-p5/all_reduce_p16.txt": (None, None, 32),  # indented mpirun prefixes, no rank lines
    }
    for name, (ranks, hosts, rows) in expected.items():
        log = read_log(DATA / name)
        assert (log.world_size, log.num_hosts, len(log.rows)) == (ranks, hosts, rows), name
    last = read_log(DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt").rows[-1]
    assert (last.num_bytes, last.time_us, last.busbw_gbps) == (8589934592, 67689.0, 237.94)
    assert last.inplace_time_us == 67811.0


HEADER = "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"  # noqa: E501
ROW = "     1048576        262144     float     sum      -1    85.58   12.25   22.97      0    84.50   12.41   23.27      0"  # noqa: E501
RANKS = "#  Rank  0 Group  0 Pid     43 on a device  0 [0x0f] GPU\n#  Rank  1 Group  0 Pid     44 on b device  0 [0x0f] GPU"  # noqa: E501
RCCL_RANKS = "#   Rank  0 Pid 3844613 on     gpu-53 device  0 [0000:05:00.0] AMD Instinct MI300X\n#   Rank  1 Pid 366643 on     gpu-56 device  0 [0000:05:00.0] AMD Instinct MI300X"  # noqa: E501
"""rccl-tests' rank lines: no Group column (the layout of public MI300X logs)."""


def test_mpirun_prefixes_and_an_old_layout_without_root() -> None:
    text = "\n".join(
        f"[1,0]<stdout>:{line}"
        for line in [
            RANKS.splitlines()[0],
            RANKS.splitlines()[1],
            HEADER,
            ROW,
            "# Avg bus bandwidth    : 1.0",
        ]
    )
    log = parse_text(text, "prefixed.txt")
    assert log.world_size == 2 and log.rows[0].time_us == 85.58
    old = "\n".join(
        [
            "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",  # noqa: E501
            "     1048576        262144   float     sum    90.00   11.65   20.39  0e+00    91.00   11.52   20.17  0e+00",  # noqa: E501
            "# Avg bus bandwidth    : 20.3",
        ]
    )
    row = parse_text(old, "old.txt").rows[0]
    assert (row.time_us, row.busbw_gbps, row.inplace_time_us) == (90.0, 20.39, 91.0)
    rccl = parse_text(f"{RCCL_RANKS}\n{HEADER}\n{ROW}\n# Avg bus bandwidth : 1\n", "rccl.txt")
    assert (rccl.world_size, rccl.num_hosts) == (2, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n", "old.txt: no nccl-tests table found"),
        (
            f"{HEADER}\n{ROW[:60]}\n# Avg bus bandwidth : 1\n",
            "old.txt:2: 6 fields where the header",
        ),
        (f"{ROW}\n", "old.txt:1: a table row before any header"),
        (
            "# nThread 1 nGpus 1\n# Using devices\n# nThread 1 nGpus 1\n# Using devices\n"
            "#  Rank  0 Pid 11 on host-a device  0 [0x00] GPU\n"
            "#  Rank  0 Pid 12 on host-b device  0 [0x00] GPU\n"
            f"{HEADER}\n{HEADER}\n{ROW}\n{ROW}\n",
            r"old.txt:6: rank 0 is listed twice \(host-a, host-b\).*without MPI=1",
        ),
        (
            f"{HEADER}\n{ROW.replace('85.58', 'abc')}\n# Avg bus bandwidth : 1\n",
            "time 'abc' is not a number",
        ),
    ],
)
def test_bad_or_partial_logs_are_refused_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_text(text, "old.txt")


def test_calibration_lowers_the_error_it_fits() -> None:
    cluster = load_cluster("oci-bm-gpu4.8")
    log = read_log(DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt")
    rows = [r for r in log.rows if r.num_bytes >= 1 << 20]
    sizes = [r.num_bytes for r in rows]

    def error(fit=DESCRIPTION) -> float:
        pred = predict(cluster, 16, sizes, fit=fit)
        return sum(abs(p.time_us - r.time_us) / r.time_us for p, r in zip(pred, rows, strict=True))

    cal = calibrate(cluster, [log])
    assert error(cal) < error()


def test_collective_command_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collective", "--cluster", "dgx-a100", "--world-size", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["bytes"] == 1 << 20 and rows[-1]["bytes"] == 4 << 30
    assert all(r["time_us"] > 0 for r in rows)
    assert main(["collective", "--cluster", "dgx-a100", "--world-size", "12"]) == 2
    assert "multiple of its 8 GPUs" in capsys.readouterr().err
    fit = str(DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt")
    argv = ["collective", "--cluster", "oci-bm-gpu4.8", "--world-size", "32", "--fit", fit]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "calibrated on 1 log(s)" in out and "busbw" in out
    with pytest.raises(SystemExit):
        main(["collective", "--cluster", "dgx-a100", "--world-size", "8", "--interconnect", "x"])
