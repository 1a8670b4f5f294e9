"""Trace parsing: loading errors, rule tables per regime, step windows, collectives, streaming."""

from __future__ import annotations

import dataclasses
import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from trace_events import x

from commprof.traces import column_builder
from commprof.traces.column_builder import read_columns
from commprof.traces.intervals import total_length
from commprof.traces.trace_notes import trace_notes
from commprof.traces.trace_parser import RULES, ParsedTrace, Rule, load_trace, parse_trace
from commprof.traces.trace_rules import COLLECTIVE_ARG_KEYS

GOLDEN = Path(__file__).parent / "data" / "golden_gloo2"


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return x(f"ProfilerStep#{n}", "user_annotation", ts, dur)


def trace(events: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"traceEvents": events, **top}


def pairs(s: Any) -> list[tuple[int, int]]:
    return list(zip(s.starts.tolist(), s.ends.tolist(), strict=True))


def test_load_trace_errors(tmp_path: Path) -> None:
    good = json.dumps(trace([step(0, 0, 1)])).encode()
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(good)[:-20])
    with pytest.raises(ValueError, match="truncated or corrupt gzip"):
        load_trace(tmp_path / "t.json.gz")
    (tmp_path / "t.json").write_bytes(good[:-5])
    with pytest.raises(ValueError, match="not valid JSON"):
        load_trace(tmp_path / "t.json")
    (tmp_path / "e.json").write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        load_trace(tmp_path / "e.json")
    (tmp_path / "d.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        load_trace(tmp_path / "d.json")
    (tmp_path / "n.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="no events"):
        load_trace(tmp_path / "n.json")
    (tmp_path / "arr.json").write_text(json.dumps([step(0, 0, 1)]))  # JSON Array Format
    assert len(load_trace(tmp_path / "arr.json")["traceEvents"]) == 1


@pytest.mark.parametrize("dur", [-1.5, 1e12, None, "abc"])
def test_bad_durations_are_errors(dur: Any) -> None:
    ev = step(0, 0, 10)
    bad = x("aten::mm", "cpu_op", 1, 1)
    if dur is None:
        del bad["dur"]
    else:
        bad["dur"] = dur
    with pytest.raises(ValueError, match="dur"):
        parse_trace(trace([ev, bad]))


def test_timestamps_round_to_nanoseconds() -> None:
    # 0.0019 us is 1.9 ns: rounding gives 2, truncation would give 1.
    t = trace([step(0, 0, 10), x("aten::mm", "cpu_op", 0.0019, 1.0016)])
    p = parse_trace(t, regime="cpu-gloo")
    assert pairs(p.classes["compute"]) == [(2, 2 + 1002)]


def test_cpu_gloo_rules() -> None:
    events = [
        step(7, 0, 100),
        x("aten::addmm", "cpu_op", 10, 50),  # compute [10, 60)
        x("aten::mm", "cpu_op", 20, 5),  # nested: merged into the parent
        x("c10d::allreduce_", "cpu_op", 40, 4),  # enqueue inside compute: carved out
        x(
            "gloo:all_reduce",
            "user_annotation",
            41,
            30,
            tid=9,
            **{"Input Dims": [[250]], "Input type": ["float"]},
        ),
        x("aten::copy_", "cpu_op", 50, 5, tid=9),  # on the gloo thread: ignored
        x("Optimizer.step#SGD.step", "user_annotation", 80, 10),  # annotation: ignored
    ]
    p = parse_trace(trace(events, distributedInfo={"backend": "gloo", "rank": 3, "world_size": 4}))
    assert (p.regime, p.rank, p.world_size) == ("cpu-gloo", 3, 4)
    assert p.step_ids.tolist() == [7] and p.step_source == "ProfilerStep"
    assert pairs(p.classes["compute"]) == [(10_000, 40_000), (44_000, 60_000)]
    assert pairs(p.classes["other"]) == [(40_000, 44_000)]
    assert pairs(p.classes["communication"]) == [(41_000, 71_000)]
    assert total_length(p.classes["memcpy"]) == 0
    row = p.collectives.iloc[0]
    assert (row["name"], row["num_bytes"], row["step"], row["duration_ns"]) == (
        "gloo:all_reduce",
        250 * 4,
        7,
        30_000,
    )


def nccl_events() -> list[dict[str, Any]]:
    meta = {"Collective name": "allreduce", "In msg nelems": 1000, "dtype": "BFloat16",
            "Process Group Name": "0", "Seq": 5}  # fmt: skip
    return [
        step(1, 0, 200),
        x("sm90_xmma_gemm", "kernel", 10, 40, tid=7),
        x("my_custom_allreduce", "kernel", 30, 20, tid=20, **meta),  # metadata wins over name
        x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 100, 10, tid=20),  # name fallback
        x("ncclKernel_AllGather_RING_LL_Sum_int8_t", "kernel", 120, 10, tid=20),  # old name
        x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 150, 5, tid=7),
        x("Memset (Device)", "gpu_memset", 160, 5, tid=7),
        x("cudaLaunchKernel", "cuda_runtime", 9, 1),  # host side: ignored
    ]


def test_newer_kinetos_seq_num_is_the_sequence_number() -> None:
    events = nccl_events()
    newer = events[2]["args"]
    newer["seq_num"] = newer.pop("Seq")  # newer Kineto spells it seq_num
    p = parse_trace(trace(events, distributedInfo={"backend": "nccl", "rank": 0}))
    assert p.collectives["seq"].tolist()[0] == 5


def test_cuda_nccl_metadata_first_then_name_patterns() -> None:
    p = parse_trace(trace(nccl_events(), distributedInfo={"backend": "nccl", "rank": 0}))
    assert p.regime == "cuda-nccl"
    assert pairs(p.classes["communication"]) == [
        (30_000, 50_000),
        (100_000, 110_000),
        (120_000, 130_000),
    ]
    assert pairs(p.classes["compute"]) == [(10_000, 50_000)]
    assert pairs(p.classes["memcpy"]) == [(150_000, 155_000)]
    assert pairs(p.classes["memset"]) == [(160_000, 165_000)]
    first = p.collectives.iloc[0]
    assert (first["name"], first["num_bytes"], first["seq"], first["process_group"]) == (
        "allreduce",
        2000,
        5,
        "0",
    )
    assert p.collectives["num_bytes"].isna().tolist() == [False, True, True]


def test_regime_detection_without_distributed_info_and_forcing() -> None:
    assert parse_trace(trace(nccl_events())).regime == "cuda-nccl"
    assert parse_trace(trace([step(0, 0, 5), x("aten::mm", "cpu_op", 1, 1)])).regime == "cpu-gloo"
    forced = parse_trace(trace(nccl_events()), regime="cuda-gloo")
    assert forced.regime == "cuda-gloo"
    assert total_length(forced.classes["communication"]) == 0  # no gloo annotations
    with pytest.raises(ValueError, match="regime must be one of"):
        parse_trace(trace(nccl_events()), regime="tpu")


def test_cuda_gloo_staging_copies_count_as_communication() -> None:
    events = [
        step(0, 0, 100),
        x("gloo:all_reduce", "user_annotation", 10, 50, tid=9),
        x("cudaMemcpyAsync", "cuda_runtime", 11, 1, tid=9, correlation=41),
        x("cudaMemcpyAsync", "cuda_runtime", 70, 1, tid=1, correlation=42),
        x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 12, 3, tid=7, correlation=41),
        x("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 72, 3, tid=7, correlation=42),
        x("elementwise_kernel", "kernel", 80, 5, tid=7, correlation=43),
    ]
    p = parse_trace(trace(events, distributedInfo={"backend": "gloo"}, deviceProperties=[{}]))
    assert p.regime == "cuda-gloo"
    assert pairs(p.classes["communication"]) == [(10_000, 60_000)]  # copy [12,15) inside
    assert pairs(p.classes["memcpy"]) == [(72_000, 75_000)]
    assert pairs(p.classes["compute"]) == [(80_000, 85_000)]
    assert len(p.collectives) == 1  # staging copies are not collectives


def test_no_step_annotations_falls_back_to_whole_trace_with_warning() -> None:
    t = trace([x("aten::mm", "cpu_op", 5, 10), x("aten::add", "cpu_op", 30, 5)])
    with pytest.warns(UserWarning, match="no ProfilerStep"):
        p = parse_trace(t)
    assert (p.step_ids.tolist(), p.step_start_ns.tolist(), p.step_end_ns.tolist()) == (
        [0],
        [5000],
        [35000],
    )
    assert p.step_source == "whole trace"


def test_rank_from_file_name(tmp_path: Path) -> None:
    path = tmp_path / "worker_rank5.pt.trace.json"
    path.write_text(json.dumps(trace([step(0, 0, 5), x("aten::mm", "cpu_op", 1, 1)])))
    assert parse_trace(path).rank == 5
    assert parse_trace(load_trace(path)).rank == 0  # no name, no distributedInfo


def test_user_can_extend_a_rule_table() -> None:
    mine = Rule(target="communication", cats=frozenset({"cpu_op"}), name=r"my_allreduce",
                collective=True, why="a custom collective")  # fmt: skip
    table = dataclasses.replace(RULES["cpu-gloo"], rules=(mine, *RULES["cpu-gloo"].rules))
    t = trace([step(0, 0, 50), x("my_allreduce", "cpu_op", 10, 10), x("aten::mm", "cpu_op", 30, 5)])
    p = parse_trace(t, rules=table)
    assert pairs(p.classes["communication"]) == [(10_000, 20_000)]
    assert pairs(p.classes["compute"]) == [(30_000, 35_000)]
    with pytest.raises(ValueError, match=r"Rule\.target"):
        Rule(target="gpu", why="bad")


def test_golden_traces_parse() -> None:
    for rank in (0, 1):
        p = parse_trace(GOLDEN / f"rank{rank}_steps2-4.json.gz")
        assert (p.rank, p.world_size, p.regime) == (rank, 2, "cpu-gloo")
        assert p.step_ids.tolist() == [2, 3, 4]
        assert np.all(p.step_start_ns[1:] >= p.step_end_ns[:-1])
        # Three DDP buckets (make_golden.py: 0.25 MiB cap, 4 linear layers) a step.
        assert p.collectives.groupby("step").size().tolist() == [3, 3, 3]
        assert sorted(p.collectives["num_bytes"].unique().tolist()) == sorted(
            [4 * (512 * 192 + 192 + 192 * 10 + 10), 4 * (512 * 512 + 512), 4 * (256 * 512 + 512)]
        )


# ---------------------------------------------------------------- streaming reader

TRICKY_TOP = {
    "schemaVersion": 1,
    "deviceProperties": [{"name": 'GPU "0" \\ caf\u00e9', "totalGlobalMem": 85029158912}],
    "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
}


def tricky_events() -> list[dict[str, Any]]:
    """Events whose text has escapes, non-ASCII, long numbers and literals to cut."""
    meta: dict[str, Any] = {"Collective name": "allreduce", "In msg nelems": 3, "dtype": "Float",
            "Process Group Name": "default_pg \"x\"", "Seq": 12345678901234}  # fmt: skip
    odd: dict[str, Any] = {"Input Dims": [[2, 3], []], "flag": True, "none": None, "neg": -1.5e-7}
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "py\\thon"}},
        step(3, 1e-3, 250.5),
        x(
            'aten::mm "q" \\ \u00e9\u4e2d\U0001f600',
            "cpu_op",
            2.125,
            1.0,
            **odd,
        ),
        x(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "kernel",
            10.001,
            20.999,
            tid=20,
            correlation=7,
            **meta,
        ),
        x("cudaLaunchKernelExC", "cuda_runtime", 9.5, 0.25, correlation=7),
        x("sm90_gemm", "kernel", 12, 30, tid=7, correlation=8),
        {"ph": "f", "id": 7, "pid": 1, "tid": 1, "ts": 9.5, "bp": "e"},
    ]


def write_trace(path: Path, text: str) -> Path:
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_stream_equals_json_loads_at_every_chunk_size(
    tmp_path: Path, suffix: str, ascii_only: bool
) -> None:
    # Keys after traceEvents and a long number last: Kineto writes both.
    doc = {**TRICKY_TOP, "traceEvents": tricky_events(), "traceName": "r1", "baseNs": 10**18}
    text = json.dumps(doc, indent=1, ensure_ascii=ascii_only)
    path = write_trace(tmp_path / f"t{suffix}", text)
    want = json.loads(text)
    # Every chunk size up to a whole event puts a boundary inside every string,
    # escape, number and literal of the text at least once.
    for chunk_bytes in [*range(1, 300), len(text) - 1, len(text), len(text) + 1]:
        assert load_trace(path, chunk_bytes=chunk_bytes) == want, chunk_bytes


def assert_same_parse(a: ParsedTrace, b: ParsedTrace) -> None:
    for name in ("rank", "world_size", "regime", "step_source"):
        assert getattr(a, name) == getattr(b, name), name
    for name in ("step_ids", "step_start_ns", "step_end_ns"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for c in a.classes:
        assert pairs(a.classes[c]) == pairs(b.classes[c]), c
    pd.testing.assert_frame_equal(a.collectives, b.collectives)


def test_streaming_and_dict_paths_agree_on_golden_traces() -> None:
    for rank in (0, 1):
        path = GOLDEN / f"rank{rank}_steps2-4.json.gz"
        from_dict = parse_trace(load_trace(path), source=str(path))
        assert len(from_dict.collectives) == 9  # three buckets in each of three steps
        assert_same_parse(parse_trace(path), from_dict)
        assert_same_parse(parse_trace(path, chunk_bytes=997), from_dict)  # ~350 chunks


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 22])
def test_streaming_and_dict_paths_agree_on_tricky_trace(tmp_path: Path, chunk_bytes: int) -> None:
    doc = {**TRICKY_TOP, "traceEvents": tricky_events()}
    path = write_trace(tmp_path / "rank9.json.gz", json.dumps(doc, ensure_ascii=False))
    streamed = parse_trace(path, chunk_bytes=chunk_bytes)
    assert_same_parse(streamed, parse_trace(doc, source=str(path)))
    assert (streamed.regime, streamed.rank, streamed.world_size) == ("cuda-nccl", 1, 2)
    # 10.001 us -> 10_001 ns; + rint(20.999 us * 1000) = 20_999 ns.
    assert pairs(streamed.classes["communication"]) == [(10_001, 31_000)]
    assert pairs(streamed.classes["compute"]) == [(12_000, 42_000)]
    row = streamed.collectives.iloc[0]
    assert (row["name"], row["num_bytes"], row["seq"], row["step"]) == (
        "allreduce",
        3 * 4,
        12345678901234,
        3,
    )


def test_columns_keep_args_only_where_rules_need_them() -> None:
    events = [
        *tricky_events(),
        x("gloo:all_reduce", "user_annotation", 40, 5, tid=9, **{"Input Dims": [[4]]}),
        x("my_kernel", "kernel", 50, 5, tid=7, **{"Collective name": "broadcast", "x": 1}),
    ]
    cols = read_columns(trace(events), RULES.values())
    # The NCCL kernel (name rule), the gloo annotation (collective rule) and the
    # kernel with collective metadata (has_arg rule); not the cpu_op with shapes.
    kept = {cols.names[cols.name_code[i]]: a for i, a in cols.args.items()}
    assert sorted(kept) == [
        "gloo:all_reduce",
        "my_kernel",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    ]
    assert kept["my_kernel"] == {"Collective name": "broadcast"}  # only the keys rules read
    assert set(kept["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]) <= set(COLLECTIVE_ARG_KEYS)
    assert cols.correlation.tolist() == [-1, -1, 7, 7, 8, -1, -1]
    # Only the cpu-gloo table: kernels are never its collectives, so their args go.
    gloo_only = read_columns(trace(events), [RULES["cpu-gloo"]])
    assert [gloo_only.names[gloo_only.name_code[i]] for i in gloo_only.args] == ["gloo:all_reduce"]


def test_streaming_memory_is_bounded_by_columns_not_text(tmp_path: Path) -> None:
    # Kineto-like steps: launches and kernels with their usual args, one NCCL
    # all-reduce with collective metadata a step.
    kernel_args = {"device": 0, "stream": 7, "grid": [132, 1, 1], "block": [256, 1, 1],
                   "registers per thread": 90, "shared memory": 0}  # fmt: skip
    meta = {"Collective name": "allreduce", "In msg nelems": 1000, "dtype": "Float",
            "Process Group Name": "0", "Seq": 1}  # fmt: skip
    num_steps, events = 300, []
    for s in range(num_steps):
        t0 = s * 1000.0
        events.append(step(s, t0, 1000))
        for k in range(10):
            corr = s * 100 + k
            events.append(x("cudaLaunchKernel", "cuda_runtime", t0 + k, 1, correlation=corr))
            events.append(
                x(
                    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
                    "kernel",
                    t0 + 50 + 40 * k,
                    30,
                    tid=7,
                    correlation=corr,
                    **kernel_args,
                )
            )
        events.append(
            x(
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "kernel",
                t0 + 300,
                400,
                tid=20,
                correlation=s * 100 + 99,
                **kernel_args,
                **meta,
            )
        )
    text = json.dumps(trace(events, distributedInfo={"backend": "nccl"}))
    path = write_trace(tmp_path / "big.json", text)
    tracemalloc.start()
    try:
        parsed = parse_trace(path, chunk_bytes=1 << 16)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(parsed.collectives) == num_steps
    # Loading the text whole takes len(text) bytes and its event dicts 3-4 times
    # that (json.loads); streaming holds 1.25 chunks of text and about 40 bytes an
    # event, classification about 100 at its peak: about 0.55 * len(text) here.
    assert peak_bytes < len(text), (peak_bytes, len(text))


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_streaming_parse_errors(tmp_path: Path, suffix: str) -> None:
    good = json.dumps(trace([step(0, 0, 1)]))
    cases = {
        "": "empty file",
        " \n\t ": "empty file",
        good[:-5]: "not valid JSON",
        good + " x": "not valid JSON",
        good.replace(", ", " ", 1): "not valid JSON",
        '{"a": 1}': "not a Chrome trace",
        '{"traceEvents": 5}': "not a Chrome trace",
        "[1, 2]": "not a Chrome trace",
        "42": "not a Chrome trace",
        '{"traceEvents": []}': "no events",
        json.dumps(trace([{"ph": "M", "name": "thread_name"}])): "no complete",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = write_trace(tmp_path / f"c{i}{suffix}", text)
        for chunk_bytes in (3, 1 << 22):
            with pytest.raises(ValueError, match=message):
                parse_trace(path, chunk_bytes=chunk_bytes)


def test_streaming_rejects_truncated_gzip_and_bad_durations(tmp_path: Path) -> None:
    good = json.dumps(trace([step(0, 0, 1), x("aten::mm", "cpu_op", 1, 1)])).encode()
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(good)[:-20])
    with pytest.raises(ValueError, match="truncated or corrupt gzip"):
        parse_trace(tmp_path / "t.json.gz")
    for dur in (-1.5, 1e12, None, "abc"):  # -1 is the profiler's unfinished mark
        bad = trace([step(0, 0, 10), {**x("aten::mm", "cpu_op", 1, 1), "dur": dur}])
        path = write_trace(tmp_path / "bad.json", json.dumps(bad))
        with pytest.raises(ValueError, match="dur"):
            parse_trace(path)


# ---------------------------------------------------------------- real-trace rules


def test_integers_past_64_bits_neither_break_nor_corrupt(tmp_path: Path) -> None:
    big = 2**70 + 1
    coll = {"Collective name": "allreduce", "Seq": big, "In msg nelems": 4, "dtype": "Float",
            "External id": 2**90}  # fmt: skip
    events = [
        step(0, 0, 100),
        x("cudaLaunchKernel", "cuda_runtime", 1, 1, correlation=big),
        x(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "kernel",
            10,
            20,
            tid=20,
            correlation=big,
            **coll,
        ),
        x("sm90_gemm", "kernel", 15, 10, tid=7, correlation=5, **{"Ev Idx": -(2**80)}),
    ]
    path = write_trace(tmp_path / "rank0.json", json.dumps(trace(events)))
    assert load_trace(path)["traceEvents"][2]["args"]["Seq"] == big  # exact, not a float
    for p in (parse_trace(path), parse_trace(trace(events))):
        row = p.collectives.iloc[0]
        assert pd.isna(row["seq"]) and row["num_bytes"] == 16  # past int64: unknown, not wrapped
        assert pairs(p.classes["communication"]) == [(10_000, 30_000)]
        assert p.num_unlaunched == 2  # correlation past int64 is no id; 5 has no launch
    late = trace([step(0, 0, 1), x("late_kernel", "kernel", 2**64, 1)])  # a JSON integer
    with pytest.raises(ValueError, match=r"past what int64 nanoseconds hold.*'late_kernel'"):
        parse_trace(write_trace(tmp_path / "late.json", json.dumps(late)))


def kernel(name: str, ts: float, dur: float, corr: int, **args: Any) -> dict[str, Any]:
    return x(name, "kernel", ts, dur, tid=7, correlation=corr, **args)


def launch(ts: float, corr: int) -> dict[str, Any]:
    return x("cudaLaunchKernel", "cuda_runtime", ts, 1, correlation=corr)


def test_step_windows_follow_the_launches_onto_the_gpu() -> None:
    # Launched at 1 and 101 us, run at [20, 50) and [120, 150): each window runs from the first
    # to the last device activity its ProfilerStep launched, whatever Kineto's device
    # annotations say.
    kernels = [launch(1, 1), kernel("gemm", 20, 30, 1), launch(101, 2), kernel("gemm", 120, 30, 2)]
    cpu = [step(0, 0, 100), step(1, 100, 100)]
    bad = [x(f"ProfilerStep#{n}", "gpu_user_annotation", t, 16) for n, t in ((0, 60), (1, 160))]
    p = parse_trace(trace(cpu + bad + kernels))
    assert p.step_source == "ProfilerStep launches"
    assert (p.step_start_ns.tolist(), p.step_end_ns.tolist()) == (
        [20_000, 120_000],
        [50_000, 150_000],
    )


def test_device_step_windows_only_where_they_hold_the_kernels() -> None:
    # Kernels whose launches are not in the trace: Kineto's device annotations are the only
    # device-side windows, used only where they hold the kernels.
    kernels = [kernel("gemm", 20, 30, 1), kernel("gemm", 120, 30, 2)]
    cpu = [step(0, 0, 100), step(1, 100, 100)]
    # In phase: the device windows [15, 60) and [115, 160) hold every kernel: used.
    good = [x(f"ProfilerStep#{n}", "gpu_user_annotation", t, 45) for n, t in ((0, 15), (1, 115))]
    p = parse_trace(trace(cpu + good + kernels))
    assert p.step_source == "device ProfilerStep"
    assert (p.step_start_ns.tolist(), p.step_end_ns.tolist()) == (
        [15_000, 115_000],
        [60_000, 160_000],
    )
    # Out of phase and 16 us long (the ROCm case): they hold 0 us of the 60 us of kernels.
    bad = [x(f"ProfilerStep#{n}", "gpu_user_annotation", t, 16) for n, t in ((0, 60), (1, 160))]
    with pytest.warns(UserWarning, match="0.000 ms of kernel time against 0.060 ms"):
        q = parse_trace(trace(cpu + bad + kernels))
    assert q.step_source == "ProfilerStep"
    assert (q.step_start_ns.tolist(), q.step_end_ns.tolist()) == ([0, 100_000], [100_000, 200_000])


def test_unlaunched_kernels_kept_by_default_dropped_on_request() -> None:
    events = [
        step(0, 0, 100),
        launch(1, 1),
        kernel("gemm", 10, 40, 1),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 40, 7),  # launched before the trace
        kernel("gemm_from_before", 0, 5, 8),
        x("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 80, 2, tid=7, correlation=9),
    ]
    keep = parse_trace(trace(events))
    assert (keep.num_unlaunched, keep.unlaunched_ns) == (3, (40 + 5 + 2) * 1000)
    assert keep.unlaunched_comm_ns == 40_000
    assert pairs(keep.classes["communication"]) == [(30_000, 70_000)]
    assert pairs(keep.classes["compute"]) == [(0, 5_000), (10_000, 50_000)]
    drop = parse_trace(trace(events), unlaunched="drop")
    assert (drop.num_unlaunched, drop.unlaunched_ns, drop.unlaunched_comm_ns) == (3, 47_000, 40_000)
    assert total_length(drop.classes["communication"]) == 0 and len(drop.collectives) == 0
    assert pairs(drop.classes["compute"]) == [(10_000, 50_000)]
    assert total_length(drop.classes["memcpy"]) == 0
    with pytest.raises(ValueError, match="unlaunched must be one of"):
        parse_trace(trace(events), unlaunched="hta")


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("void c10d::symmetric_memory::(anonymous namespace)::multimem_all_reduce_kernel<float>()",
         "all_reduce"),
        ("void c10d::symmetric_memory::(anonymous namespace)::one_shot_all_reduce_kernel<8>()",
         "all_reduce"),
        ("two_shot_all_reduce_kernel<__nv_bfloat16, 16>", "all_reduce"),
        ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*)", "all_reduce"),
        ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "unknown"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
        ("ncclDevKernel_SendRecv", "send_recv"),
    ],
)  # fmt: skip
def test_non_nccl_and_rccl_comm_kernels_are_communication(name: str, kind: str) -> None:
    events = [step(0, 0, 100), launch(1, 1), kernel(name, 10, 20, 1), kernel("gemm", 20, 20, 2)]
    p = parse_trace(trace(events))  # no distributedInfo: the comm kernel decides the regime
    assert p.regime == "cuda-nccl"
    assert pairs(p.classes["communication"]) == [(10_000, 30_000)]
    assert p.collectives["collective_type"].tolist() == [kind]


def test_collective_metadata_names_the_type() -> None:
    # FSDP's collectives, all-to-all and send/recv by Kineto's 'Collective name' arg, on a
    # kernel whose name says nothing (RCCL's generic kernel).
    names = ["_allgather_base", "reduce_scatter_tensor_coalesced", "all_to_all", "send", "recv"]
    events = [step(0, 0, 1000)] + [
        kernel("ncclDevKernel_Generic_1", 10 + 100 * i, 50, 10 + i, **{"Collective name": n})
        for i, n in enumerate(names)
    ]
    p = parse_trace(trace(events, distributedInfo={"backend": "nccl"}))
    assert p.collectives["collective_type"].tolist() == [
        "all_gather", "reduce_scatter", "all_to_all", "send_recv", "send_recv",
    ]  # fmt: skip
    assert p.num_unlaunched == len(names)


def test_cuts_inside_strings_and_nested_objects_are_retried(tmp_path: Path) -> None:
    # Text that looks like an element boundary ('}, {') inside a string and inside a list
    # of objects in args: a cut there does not decode, and the reader tries the one before.
    events = [
        step(0, 0, 100),
        x('weird}, {"name": "x', "cpu_op", 1, 2, nested=[{"a": 1}, {"b": [{"c": 2}, {}]}]),
        x("aten::mm", "cpu_op", 5, 2, shapes=[{}, {}, {}]),
        {"ph": "i", "name": "}, {", "ts": 7, "pid": 1, "tid": 1, "s": "t"},
    ]
    text = json.dumps(trace(events), indent=1)
    path = write_trace(tmp_path / "t.json", text)
    want = json.loads(text)
    from_dict = parse_trace(want, source=str(path))
    for chunk_bytes in [*range(1, 120, 7), len(text)]:
        assert load_trace(path, chunk_bytes=chunk_bytes) == want, chunk_bytes
        assert_same_parse(parse_trace(path, chunk_bytes=chunk_bytes), from_dict)
    assert pairs(from_dict.classes["compute"]) == [(1_000, 3_000), (5_000, 7_000)]


def test_a_trace_without_distributed_info_keeps_only_the_events_its_rules_can_use(
    tmp_path: Path,
) -> None:
    # No distributedInfo: every regime's rules may apply, so the columns keep their
    # categories, the launches and step annotations, and events of any other category named
    # like a gloo thread marker or a comm kernel; a python_function (a category no rule reads)
    # is dropped whatever its name, unless a communication library's (test_possible_python.py).
    events = [
        step(0, 0, 100),
        x("gloo:all_reduce", "user_annotation", 10, 30, tid=2),  # communication
        x("aten::add", "cpu_op", 5, 20, tid=1),  # compute
        x("aten::copy_", "cpu_op", 12, 5, tid=2),  # on the gloo thread: ignored
        x("forward", "python_function", 0, 90, tid=1),  # no rule reads it: dropped
        x("gloo:wait", "custom_category", 50, 1, tid=3),  # marks thread 3: kept
        x("gloo:x", "python_function", 70, 1, tid=4),  # a category no rule reads: dropped
        x("aten::mul", "cpu_op", 60, 10, tid=3),  # on thread 3: ignored, not compute
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace(events)))
    for source in (trace(events), path):
        cols = read_columns(source, RULES.values())
        assert "forward" not in cols.names and "gloo:x" not in cols.names
        assert "gloo:wait" in cols.names
        p = parse_trace(source)
        assert p.regime == "cpu-gloo"
        assert pairs(p.classes["compute"]) == [(5_000, 25_000)]
        assert pairs(p.classes["communication"]) == [(10_000, 40_000)]
        assert p.collectives["name"].tolist() == ["gloo:all_reduce"]


def test_bad_times_are_counted_over_every_chunk_and_the_first_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ts/dur are converted and checked a chunk at a time (a file's chunk, or BLOCK_EVENTS
    # events of a dict): the message counts the bad events of every chunk and names the first.
    events = [step(0, 0, 100)] + [x(f"op{i}", "cpu_op", i, 1) for i in range(10)]
    events[3]["dur"] = -2.0
    events[6]["ts"] = None
    events[9]["dur"] = 1e12
    first = r"3 event\(s\) with missing, negative or absurd ts/dur \(first: 'op2' ts=2.0 dur=-2.0\)"
    only_none = r"1 event\(s\) .* \(first: 'op5' ts=None dur=1\)"
    monkeypatch.setattr(column_builder, "BLOCK_EVENTS", 2)
    path = tmp_path / "bad.json"
    for evs, want in ((events, first), ([events[0], events[6]], only_none)):
        with pytest.raises(ValueError, match=want):
            parse_trace(trace(evs), regime="cpu-gloo")
        path.write_text(json.dumps(trace(evs)))
        with pytest.raises(ValueError, match=want):
            parse_trace(path, regime="cpu-gloo", chunk_bytes=64)


def test_unfinished_events_as_the_profiler_writes_them_are_dropped_counted_and_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The profiler writes an op it saw start but not end with dur -1 (PyTorch 2.7 on), and
    # one it saw end but not start with ts 0 and the end's epoch time as dur (a sweep's own
    # trace held 'aten::to' ts=0.0 dur=1796636603076015.0): such a trace is read, the events
    # dropped, counted and noted; a dur of -2 or 1e12 is still a corrupt trace.
    ops = [x(f"op{i}", "cpu_op", 10 + i, 1) for i in range(8)]
    ops[2]["dur"] = -1.0
    ops[5].update(ts=0.0, dur=1796636603076015.0)
    coll = [x("gloo:all_reduce", "user_annotation", 30 + 5 * i, 4, tid=2, Seq=i) for i in range(3)]
    coll[1]["dur"] = -1.0
    events = [step(0, 5, 100), *ops, *coll]
    monkeypatch.setattr(column_builder, "BLOCK_EVENTS", 3)
    path = tmp_path / "unfinished.json"
    path.write_text(json.dumps(trace(events)))
    for source in (trace(events), path):
        p = parse_trace(source, regime="cpu-gloo", chunk_bytes=64)
        assert p.num_unfinished == 3
        assert (p.step_start_ns[0], p.step_end_ns[0]) == (5_000, 105_000)  # not stretched to 0
        assert p.collectives["seq"].tolist() == [0, 2]  # each kept event keeps its own args
        cols = read_columns(source, RULES.values())
        names = [cols.names[c] for c in cols.name_code]
        assert names.count("op2") == names.count("op5") == 0 and "op7" in names
    assert any("3 unfinished events dropped" in n for n in trace_notes(p))
    only = [step(0, 5, 100), {**ops[2], "name": "only"}]
    with pytest.raises(ValueError, match=r"every complete .* event is unfinished"):
        parse_trace(trace([{**only[0], "dur": -1.0}, only[1]]), regime="cpu-gloo")


@pytest.mark.parametrize("chunk_bytes", [64, 1 << 18])
def test_raw_control_characters_in_names_are_read_leniently_and_noted(
    tmp_path: Path, chunk_bytes: int
) -> None:
    # JSON forbids a raw control character inside a string; a profiler writes one in a garbled
    # name (a CI sweep's own trace failed at 'invalid character' 2.2 MB in). Those chunks are
    # read as json.loads(strict=False) reads them, and noted; the same byte outside a string,
    # a NaN or a broken row is still an error naming the byte.
    ops = [x(f"op{i}", "cpu_op", 10 + i, 1) for i in range(8)]
    coll = [x("gloo:all_reduce", "user_annotation", 30 + 5 * i, 4, tid=2, Seq=i) for i in range(3)]
    text = json.dumps(trace([step(0, 5, 100), *ops, *coll]))
    garbled = text.replace('"op3"', '"op\\u0001\\u0007\\n3"').replace(
        "\\u0001\\u0007\\n", "\x01\x07\n"
    )
    assert "\x01" in garbled and "\\u0001" not in garbled
    path = tmp_path / "garbled.json"
    path.write_text(garbled)
    p = parse_trace(path, regime="cpu-gloo", chunk_bytes=chunk_bytes)
    clean = parse_trace(trace([step(0, 5, 100), *ops, *coll]), regime="cpu-gloo")
    assert p.collectives["seq"].tolist() == clean.collectives["seq"].tolist() == [0, 1, 2]
    assert len(p.control_chars_at) == 1
    assert garbled.encode()[p.control_chars_at[0]] == 1  # the offset names the very byte
    names = read_columns(path, RULES.values(), chunk_bytes=chunk_bytes).names
    assert "op\x01\x07\n3" in names
    assert any("raw control characters inside strings in 1 stretch" in n for n in trace_notes(p))
    # Each error names the byte where the text goes wrong, whichever decoder saw it first.
    for bad, marker in (
        (text.replace('"ph": "X", "name": "op3"', '"ph": "X",\x01 "name": "op3"'), "\x01"),
        (
            text.replace(
                '"dur": 1, "args": {}}, {"ph": "X", "name": "op4"',
                '"dur": NaN, "args": {}}, {"ph": "X", "name": "op4"',
            ),
            "NaN",
        ),
        (garbled.replace('"op7"', '"op7" "extra"'), ' "extra"'),
    ):
        assert marker in bad
        path.write_text(bad)
        with pytest.raises(ValueError, match=r"not valid JSON.* at byte (\d+)\)$") as info:
            parse_trace(path, regime="cpu-gloo", chunk_bytes=chunk_bytes)
        at = int(str(info.value).rpartition("at byte ")[2].rstrip(")"))
        assert bad.encode().index(marker.encode()) <= at <= bad.encode().index(marker.encode()) + 1


def test_an_event_without_ph_is_no_complete_event_on_either_path(tmp_path: Path) -> None:
    # an event of a kept category without 'ph' (or with a non-string one) is skipped as the
    # dict path skips it; the file path used to count it complete ('"X".__eq__' of None is
    # NotImplemented, which is true)
    ops = [x(f"op{i}", "cpu_op", 10 + i, 1) for i in range(6)]
    ops[1].pop("ph")
    ops[2]["ph"] = None
    ops[4]["ph"] = "Z"  # no phase of the format: fails the tagged structs' Literal of phases
    ops[5]["ph"] = 5
    events = [step(0, 5, 100), *ops]
    path = tmp_path / "noph.json"
    path.write_text(json.dumps(trace(events)))
    for source in (trace(events), path):
        cols = read_columns(source, RULES.values())
        kept = [cols.names[c] for c in cols.name_code]
        assert "op0" in kept and "op3" in kept
        assert not {"op1", "op2", "op4", "op5"} & set(kept)


def test_a_collective_reads_each_arg_from_its_kernel_then_from_its_launching_op() -> None:
    # The kernel's own args override its launching op's, key by key: a kernel holding some
    # keys takes the rest from record_param_comms; one holding none takes all of the op's
    # (``seq_num`` where no ``Seq``, the message size from the input shape).
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    own = [
        {"Collective name": "allreduce", "Seq": 7, "In msg nelems": 10, "dtype": "Float"},
        {},
        {"Group size": 8, "Seq": None},
    ]
    op_args: list[dict[str, Any]] = [
        {"Collective name": "broadcast", "Seq": 3, "Process Group Name": "5", "Group size": 4,
         "In msg nelems": 99, "dtype": "Double"},
        {"Collective name": "allgather", "seq_num": 11, "Process Group Name": "6",
         "Group size": 2, "In msg nelems": 6, "dtype": "Half"},
        {"Collective name": "allreduce", "Seq": 12, "Process Group Name": 5, "Group size": 4,
         "In msg nelems": 3, "dtype": "Double"},
    ]  # fmt: skip
    events = [x("ProfilerStep#1", "user_annotation", 0.0, 1000.0)]
    for i, (mine, theirs) in enumerate(zip(own, op_args, strict=True)):
        host = 100.0 + 200.0 * i
        events.append(x("record_param_comms", "cpu_op", host - 5.0, 30.0, **theirs))
        events.append(x("cudaLaunchKernel", "cuda_runtime", host, 5.0, correlation=i + 1))
        kernel = x(nccl, "kernel", host + 20.0, 50.0, 7, correlation=i + 1, **mine)
        kernel["pid"] = 0
        events.append(kernel)
    trace = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
             "traceEvents": events}  # fmt: skip
    colls = parse_trace(trace).collectives
    assert colls["collective_type"].astype(str).tolist() == ["all_reduce", "all_gather",
                                                              "all_reduce"]  # fmt: skip
    assert colls["type_source"].astype(str).tolist() == ["args", "launching op", "launching op"]
    assert colls["seq"].tolist() == [7, 11, pd.NA]  # an own Seq of null stays unknown
    assert colls["num_bytes"].tolist() == [40, 12, 24]
    # a group named by a number is its text: the same group as "5"
    assert colls["process_group"].astype(str).tolist() == ["5", "6", "5"]
    assert list(colls["process_group"].cat.categories) == ["5", "6"]
    assert colls["group_size"].tolist() == [4, 2, 8]
