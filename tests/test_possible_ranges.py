"""Host ranges named like communication that nothing counted accounts for: listed apart.

A ``user_annotation`` range (``record_function``, NVTX-style) named after a communication
library or collective, in which no counted communication kernel was launched or ran, is listed
with its host (CPU) time as "possible communication (host ranges), not counted", never added
to the kernel time of ``possible_comm_ns``. Synthetic traces built with tests/trace_events.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from commprof.cli import main
from commprof.traces.trace_parser import parse_trace
from commprof.traces.trace_rules import HOST_RANGE_PATTERN
from tests.trace_events import NCCL, x

RANGE = "deep_ep::dispatch"
PERMUTE = "void mylib::permute_tokens<8>(int4*)"  # a kernel no rule claims, no comm word


def _kernel(name: str, ts: float, dur: float, corr: int | None, **args: Any) -> dict[str, Any]:
    extra = {} if corr is None else {"correlation": corr}
    event = x(name, "kernel", ts, dur, 20, **extra, **args)
    event["pid"] = 0
    return event


def trace(*, nccl_under: bool = False, nccl_unlaunched: bool = False) -> dict[str, Any]:
    """One step [-60, 1000) us: the range [100, 160) launching PERMUTE (at 110, runs [200, 230)),
    a second range of the name [400, 420) and the compute ranges ``aten::mm`` and ``forward``;
    ``nccl_under``: an NCCL kernel (with its collective metadata) launched inside each range,
    ``nccl_unlaunched``: one running [90, 500) whose launch is not in the trace."""
    events = [
        x("ProfilerStep#1", "user_annotation", -60.0, 1060.0),
        x(RANGE, "user_annotation", 100.0, 60.0),
        x("cudaLaunchKernel", "cuda_runtime", 110.0, 4.0, correlation=1),
        _kernel(PERMUTE, 200.0, 30.0, 1),
        x(RANGE, "user_annotation", 400.0, 20.0),
        x("aten::mm", "user_annotation", 600.0, 50.0),
        x("aten::mm", "cpu_op", 600.0, 50.0),
        x("forward", "user_annotation", 700.0, 80.0),
        x("deep_ep/buffer.py(300): dispatch", "python_function", 95.0, 70.0),
    ]
    if nccl_under:
        meta = {"Collective name": "all_to_all", "Process Group Name": "0"}
        for corr, at in ((2, 140.0), (3, 405.0)):
            events.append(x("cudaLaunchKernel", "cuda_runtime", at, 4.0, correlation=corr))
            events.append(_kernel(NCCL, at + 100.0, 50.0, corr, **meta))
    if nccl_unlaunched:
        meta = {"Collective name": "all_to_all", "Process Group Name": "0"}
        events.append(_kernel(NCCL, 90.0, 410.0, None, **meta))
    return {
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
        "traceEvents": events,
    }


def test_a_library_range_over_no_communication_kernel_is_listed_with_its_host_time() -> None:
    p = parse_trace(trace())
    assert p.possible_ranges is not None
    listed = p.possible_ranges.set_index("name")
    assert list(listed.index) == [RANGE]  # aten::mm, forward and the python frame are not
    assert listed.loc[RANGE, "num_ranges"] == 2
    assert listed.loc[RANGE, "host_ns"] == 60_000 + 20_000
    # Kernel time stays apart: the kernel launched inside the range is listed on its own.
    assert p.possible_comm is not None and list(p.possible_comm["name"]) == [PERMUTE]
    assert int(p.possible_comm["time_ns"].sum()) == 30_000


@pytest.mark.parametrize("where", ["nccl_under", "nccl_unlaunched"])
def test_a_range_over_a_counted_communication_kernel_is_not_listed(where: str) -> None:
    p = parse_trace(trace(**{where: True}))
    assert len(p.collectives) >= 1  # the NCCL kernel is counted
    assert p.possible_ranges is not None and p.possible_ranges.empty


def test_only_one_of_two_ranges_over_a_counted_kernel_is_listed() -> None:
    t = trace()
    t["traceEvents"] += [
        x("cudaLaunchKernel", "cuda_runtime", 405.0, 4.0, correlation=3),
        _kernel(NCCL, 505.0, 50.0, 3, **{"Collective name": "all_to_all"}),
    ]
    p = parse_trace(t)
    assert p.possible_ranges is not None
    assert p.possible_ranges.to_dict("records") == [
        {"name": RANGE, "num_ranges": 1, "host_ns": 60_000}
    ]


@pytest.mark.parametrize("counted", [False, True])
def test_a_framework_range_is_accounted_for_by_counted_collectives_of_its_type(
    counted: bool,
) -> None:
    """TorchRec's waits and preparation around an all-to-all launched elsewhere: accounted for
    where the trace counts all-to-alls; a library's range (DeepEP) only by a kernel under it."""
    t = trace()
    t["traceEvents"].append(x("## all2all_data:recat_values ##", "user_annotation", 800.0, 40.0))
    if counted:  # an all-to-all launched at 850, outside every range, running [900, 950)
        t["traceEvents"] += [
            x("cudaLaunchKernel", "cuda_runtime", 850.0, 4.0, correlation=4),
            _kernel(NCCL, 900.0, 50.0, 4, **{"Collective name": "all_to_all"}),
        ]
    p = parse_trace(t)
    assert p.possible_ranges is not None
    listed = dict(zip(p.possible_ranges["name"], p.possible_ranges["host_ns"], strict=True))
    expected = (
        {RANGE: 80_000} if counted else {RANGE: 80_000, "## all2all_data:recat_values ##": 40_000}
    )
    assert listed == expected


@pytest.mark.parametrize(
    ("name", "listed"),
    [
        ("deep_ep::dispatch", True), ("DeepEP combine", True), ("dpsk::ep::combine", True),
        ("nvshmem_barrier_all", True), ("pplx.dispatch", True), ("mscclpp_allreduce", True),
        ("symm_mem::one_shot_all_reduce", True), ("all_to_all_single", True),
        ("AllGather", True), ("reduce_scatter_tensor", True), ("batch_isend_irecv", True),
        ("pp_send", True), ("broadcast_coalesced", True), ("nccl:all_reduce", True),
        ("moe_dispatch", True),
        ("aten::mm", False), ("aten::all_gather", False), ("c10d::allgather_", False),
        ("_c10d_functional::all_gather_into_tensor", False), ("record_param_comms", False),
        ("ProfilerStep#3", False), ("Optimizer.step#AdamW.step", False), ("forward", False),
        ("descend", False), ("sender", False), ("token_combined", False),
    ],
)  # fmt: skip
def test_range_names_that_read_like_communication(name: str, listed: bool) -> None:
    assert (re.match(HOST_RANGE_PATTERN, name) is not None) is listed


def test_cli_reports_host_ranges_apart_from_kernel_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json").write_text(json.dumps(trace()))
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["possible_ranges"] == [
        {"rank": 0, "name": RANGE, "num_ranges": 2, "host_ns": 80_000}
    ]
    row = doc["traces"][0]
    assert row["num_possible_ranges"] == 2 and row["possible_range_host_ns"] == 80_000
    assert row["possible_comm_ns"] == 30_000  # the kernel's time only, no host time
    assert any("2 host ranges of 1 names" in n for n in doc["notes"])
    assert main(["analyze", str(folder)]) == 0
    text = capsys.readouterr().out
    section = text.split("Possible communication (host ranges), not counted")[1]
    table = section.split("\n\n")[0]
    assert re.search(rf"{re.escape(RANGE)}\s+2\s+0\.080\b", table), table
