"""The trace shapes that broke ``commprof analyze`` for new users, each with closed-form values.

A GPU that lags its CPU by more than a step (RCCL's generic kernels, metadata only on the
launching op), launches whose kernels ran in CUDA graphs, a single-GPU inference trace, a
trace whose events are all written twice, one nested 100,000 deep; the merged Perfetto view.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trace_events import (
    LAG_US,
    NUM_LAG_STEPS,
    OFFSET_US,
    STEP_US,
    lagging_rank_trace,
    rank_trace,
    x,
)

from commprof.cli import main
from commprof.traces.analyze import analyze
from commprof.traces.metrics import collective_type_metrics, step_metrics, trace_overlap
from commprof.traces.rank_pool import analyze_files
from commprof.traces.trace_notes import trace_notes
from commprof.traces.trace_parser import parse_trace

US = 1000


def write(folder: Path, name: str, doc: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def test_a_gpu_lagging_its_cpu_by_more_than_a_step_has_every_collective_in_a_step() -> None:
    p = parse_trace(lagging_rank_trace())
    # Windows follow the launches: step k's GPU work runs [kP + 16000, kP + 25000) us.
    assert p.step_source == "ProfilerStep launches"
    starts = [int((k * STEP_US + 16_000) * US) for k in range(NUM_LAG_STEPS)]
    ends = [int((k * STEP_US + 25_000) * US) for k in range(NUM_LAG_STEPS)]
    assert (p.step_start_ns.tolist(), p.step_end_ns.tolist()) == (starts, ends)
    assert p.gpu_lag_ns == LAG_US * US
    colls = p.collectives
    assert len(colls) == 2 * NUM_LAG_STEPS and colls["step"].notna().all()
    # Each step launched one all-reduce and one all-gather: the same types in every step,
    # taken from the launching op (the kernels carry no metadata).
    per_step = colls.groupby("step")["collective_type"].apply(sorted).tolist()
    assert per_step == [["all_gather", "all_reduce"]] * NUM_LAG_STEPS
    assert (colls["type_source"] == "launching op").all()
    assert colls["seq"].tolist() == [s + k for k in range(NUM_LAG_STEPS) for s in (0, 100)]
    assert (colls["process_group"] == "0").all() and (colls["num_bytes"] == 4096).all()
    # Per step: comm 5000 + 1000, compute 4000, overlap [17000, 20000) = 3000, window 9000,
    # busy [16000, 22000) and [24000, 25000) = 7000, idle 2000 (us).
    steps = step_metrics(p)
    assert (steps["comm_ns"] == 6000 * US).all() and (steps["overlap_ns"] == 3000 * US).all()
    assert (steps["window_ns"] == 9000 * US).all() and (steps["idle_ns"] == 2000 * US).all()
    # The steps hold the whole trace's communication: the rank's overlap is HTA's whole-trace one.
    comm_ns, overlap_ns = trace_overlap(p)
    assert steps["comm_ns"].sum() == comm_ns and steps["overlap_ns"].sum() == overlap_ns
    types = collective_type_metrics(p).set_index(["step", "collective_type"])
    assert (types["num_collectives"] == 1).all()
    assert (types.xs("all_reduce", level=1)["overlap_ns"] == 3000 * US).all()
    assert not trace_notes(p)[1:]  # only the lag note
    assert "GPU ran 15.000 ms behind the CPU" in trace_notes(p)[0]


def test_without_launches_the_cpu_windows_lose_the_last_steps_collectives_and_say_so() -> None:
    # With no launch events the CPU windows [kP, kP + 9999) are all there is (the old reading of
    # every trace): all_reduce k starts at kP + 17000 (window k + 1), all_gather k at
    # kP + 24000 (window k + 2); all_reduce 3 and all_gather 2 and 3 fall after the last window:
    # 3 collectives, 5000 + 1000 + 1000 us, counted and noted, not lost.
    doc = lagging_rank_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_runtime"]
    p = parse_trace(doc)
    assert p.step_source == "ProfilerStep" and p.num_unlaunched == 3 * NUM_LAG_STEPS
    assert len(p.outside) == 3 and p.outside["duration_ns"].sum() == 7000 * US
    assert any("3 collectives (7.000 ms of communication)" in n for n in trace_notes(p))


def test_lagging_ranks_line_up_by_the_launching_ops_sequence_numbers(tmp_path: Path) -> None:
    for rank, offset in ((0, 0.0), (1, 2500.0)):
        write(tmp_path, f"rank{rank}.json", lagging_rank_trace(rank, offset_us=offset))
    a = analyze(tmp_path, workers=1)
    assert a.cross is not None and a.cross.matched_by == {"pg 0": "seq"}
    assert a.cross.offsets.set_index("rank")["offset_ns"].to_dict() == {0: 0, 1: 2500 * US}
    assert (a.per_rank["traces"]["num_outside"] == 0).all()


def test_outside_every_window_is_counted_and_noted() -> None:
    doc = lagging_rank_trace()
    # One more all-reduce launched after the last ProfilerStep ended.
    host = NUM_LAG_STEPS * STEP_US + 500.0
    meta = {"Collective name": "allreduce", "Process Group Name": "0", "Seq": 999}
    doc["traceEvents"] += [
        x("record_param_comms", "cpu_op", host - 8.0, 30.0, **meta),
        x("hipLaunchKernel", "cuda_runtime", host, 6.0, correlation=5000),
        x("ncclDevKernel_Generic", "kernel", host + 100_000.0, 700.0, 1, correlation=5000),
    ]
    p = parse_trace(doc)
    assert len(p.outside) == 1 and p.outside["duration_ns"].sum() == 700 * US
    assert p.outside["collective_type"].tolist() == ["all_reduce"]
    assert any("1 collectives (0.700 ms of communication)" in n for n in trace_notes(p))


def test_launches_without_kernels_say_cuda_graphs() -> None:
    events = [x("ProfilerStep#1", "user_annotation", 0, 5000)]
    for i in range(28):
        events.append(x("cudaGraphLaunch", "cuda_runtime", 10 + 100 * i, 5, correlation=i + 1))
    for i in (28, 29):
        events.append(x("cudaLaunchKernel", "cuda_runtime", 10 + 100 * i, 5, correlation=i + 1))
        events.append(x("sampling_kernel", "kernel", 20 + 100 * i, 5, 7, correlation=i + 1))
    p = parse_trace({"traceEvents": events})
    assert (p.num_launch_calls, p.num_graph_launches, p.num_device_events) == (30, 28, 2)
    note = [n for n in trace_notes(p) if "launch calls" in n]
    assert note == [
        "<dict>: 30 kernel launch calls but 2 kernel or copy events, 28 of them graph launches: "
        "the kernels ran where the profiler did not record them (CUDA graphs without graph "
        "tracing), so the GPU reads as idle; profile with graphs off (eager mode) to see them"
    ]


def test_single_gpu_inference_is_said_so() -> None:
    events = [x("ProfilerStep#0", "user_annotation", 0, 1000), x("aten::linear", "cpu_op", 1, 50)]
    events += [x("cudaLaunchKernel", "cuda_runtime", 5 + i, 1, correlation=i) for i in (1, 2)]
    events += [x("gemm", "kernel", 100, 300, 7, correlation=1),
               x("softmax", "kernel", 400, 50, 7, correlation=2)]  # fmt: skip
    p = parse_trace({"traceEvents": events})
    assert (p.regime, p.world_size, p.has_backward) == ("cuda-single", 1, False)
    assert trace_notes(p) == [
        "<dict>: one GPU and no communication (no distributedInfo, no collective): a "
        "single-GPU inference (no backward pass, no optimizer) trace, so overlap is n/a"
    ]
    counted = p.counted.set_index("name")
    assert counted.loc["gemm", "time_ns"] == 300 * US and counted.loc["gemm", "class"] == "compute"


def test_duplicated_events_are_dropped_and_counted(tmp_path: Path) -> None:
    clean, doubled = tmp_path / "clean", tmp_path / "doubled"
    for rank in range(len(OFFSET_US)):
        doc = rank_trace(rank)
        write(clean, f"rank{rank}.json", doc)
        twice = copy.deepcopy(doc)
        twice["traceEvents"] = doc["traceEvents"] + copy.deepcopy(doc["traceEvents"])
        write(doubled, f"rank{rank}.json", twice)
    a, b = analyze(clean, workers=1), analyze(doubled, workers=1)
    assert (b.per_rank["traces"]["num_duplicates"] == len(rank_trace(0)["traceEvents"])).all()
    assert (a.per_rank["traces"]["num_duplicates"] == 0).all()
    assert len(b.per_rank["collectives"]) == len(a.per_rank["collectives"])
    assert a.cross is not None and b.cross is not None
    assert a.cross.offsets.equals(b.cross.offsets)
    assert a.cross.stragglers.equals(b.cross.stragglers)
    assert any("11 duplicated events dropped" in n for n in b.notes)


def test_a_trace_nested_100000_deep_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    event = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 1, "tid": 1'
    (tmp_path / "deep.json").write_text('{"traceEvents": [' + event + ', "args": ' + deep + "}]}")
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "deep.json: JSON nested too deep to decode" in err[0]


def test_warnings_print_as_one_plain_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "rank0.json", {"traceEvents": [x("gloo:all_reduce", "user_annotation", 0, 5)]})
    assert main(["analyze", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "Warning" not in out + err and ".py:" not in out + err
    assert "  rank0.json: no ProfilerStep#N annotations; using one window" in out


def test_workers_are_bounded_by_traces_and_cpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [write(tmp_path, f"rank{r}.json", rank_trace(r)) for r in (0, 1)]
    results = analyze_files(paths, workers=4096)
    assert [r.rank for r in results] == [0, 1]
    assert "--workers 4096 bounded to" in capsys.readouterr().err


def test_a_dataset_folder_is_analysed_one_cell_at_a_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for cell in ("c1-a0", "c2-a1"):
        for rank in (0, 1):
            write(tmp_path / "traces" / cell, f"rank{rank}.json", rank_trace(rank))
    write(tmp_path / "report", "figures.json", {"not": "a trace"})
    assert main(["analyze", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["cells"]) == ["c1-a0", "c2-a1"]
    assert all(len(c["ranks"]) == 2 and c["cross_rank"] for c in doc["cells"].values())


def test_perfetto_puts_every_rank_on_one_clock_with_collectives_linked(tmp_path: Path) -> None:
    for rank in range(len(OFFSET_US)):
        write(tmp_path, f"rank{rank}.json", rank_trace(rank))
    out = tmp_path / "all.json"
    assert main(["analyze", str(tmp_path), "--perfetto", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == set(range(len(OFFSET_US)))
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {r: f"rank {r}" for r in range(len(OFFSET_US))}
    # Every collective ends at one true time on every rank: with the offsets applied, the
    # kernels' ends agree across ranks (to the us of the file's float timestamps).
    kernels = [e for e in events if e.get("ph") == "X" and e["name"].startswith("nccl")]
    ends: dict[int, list[float]] = {}
    for e in kernels:
        ends.setdefault(round(e["ts"] + e["dur"]), []).append(e["ts"] + e["dur"])
    assert len(ends) == 5 and all(len(v) == len(OFFSET_US) for v in ends.values())
    assert all(np.ptp(v) < 1e-3 for v in ends.values())
    flows = [e for e in events if e.get("cat") == "commprof_collective"]
    assert sorted({e["id"] for e in flows}) == sorted({e["id"] for e in flows if e["ph"] == "s"})
    assert [e["ph"] for e in flows].count("s") == 5 and len(flows) == 5 * len(OFFSET_US)
    for e in flows:  # each flow point lies inside a kernel slice of its rank and thread
        assert any(
            k["pid"] == e["pid"]
            and k["tid"] == e["tid"]
            and k["ts"] <= e["ts"] <= k["ts"] + k["dur"]
            for k in kernels
        )


def test_the_text_report_says_what_was_counted_and_how_the_tables_add_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "rank0.json", lagging_rank_trace())
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    counted = out.split("What was counted")[1].split("Per collective type")[0]
    rows = [line.split() for line in counted.splitlines()[2:] if line.strip()]
    # rank, class, name, num_events, time_ms: 8 generic kernels, 4 x 5 + 4 x 1 ms of them.
    assert ["0", "communication", "ncclDevKernel_Generic", "8", "24.000"] in rows
    assert ["0", "compute", "Cijk_Ailk_Bljk_SB_MT128x128x16_gemm", "4", "16.000"] in rows
    assert "Rule: a collective counts in the step that launched it" in out
    assert "Each step's comm_ms is the sum of its types' comm_ms." in out
