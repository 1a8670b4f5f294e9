"""Fuzz of the nccl-tests reader: any mutation of a real log is read or refused with a
ValueError that names the file and a line; never another exception, never a silent loss (every
table line of a read log is a row or a counted skip)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commprof.modeling.collective.nccl_log import parse_text

DATA = Path(__file__).parent / "data" / "nccl_tests"
SEEDS = [
    (DATA / name).read_text()
    for name in (
        "oci-bm-gpu4.8/all_reduce_p16_oke.txt",
        "abci-v100/broadcast_p16.txt",
        "aws-p5/all_reduce_p16_mpijob_excerpt.txt",
        "gh200-olivia/all_reduce_p16_int8_wrong.txt",
    )
]
PIECES = [
    " ",
    "\n",
    "#",
    "0",
    "-1",
    "N/A",
    "1e+09",
    "nan",
    "float",
    "[1,0]<stdout>:",
    " 3: ",
    "host:1:2 [0] NCCL INFO x",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
    "# Avg bus bandwidth : 1",
    "#  Rank  0 Group  0 Pid 1 on h device  0 [0x0f] GPU",
    "\x00",
    "é",
]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 6))):
        lines = text.splitlines(keepends=True)
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        op = draw(st.sampled_from(["insert", "delete", "cut", "swap", "dup", "char"]))
        piece = draw(st.sampled_from(PIECES) | st.text(max_size=12))
        if op == "insert":
            lines.insert(i, piece + "\n")
        elif op == "delete" and lines:
            del lines[i]
        elif op == "cut" and lines:
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))] + "\n"
        elif op == "swap" and len(lines) > 1:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "dup" and lines:
            lines.insert(i, lines[i])
        elif lines:
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + piece + lines[i][at:]
        text = "".join(lines)
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_log_is_read_or_refused_naming_file_and_line(text: str) -> None:
    try:
        log = parse_text(text, "fuzz.txt")
    except ValueError as err:
        assert re.match(r"^fuzz\.txt(:\d+)?: ", str(err)), str(err)
        return
    for run in log.runs:
        assert run.rows or run.skipped
        lines = [r.line for r in run.rows] + [s.line for s in run.skipped]
        assert len(lines) == len(set(lines)) and all(r.time_us > 0 for r in run.rows)
        assert all(r.num_bytes > 0 for r in run.rows)
