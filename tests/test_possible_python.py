"""Kernels launched inside Python functions of communication libraries: possible communication.

With ``with_stack=True`` Kineto writes every Python frame as a ``python_function`` event named
``path(LINE): function``. A kernel that no rule claims, launched (on the same thread) inside a
frame of a communication library (``trace_rules.PYTHON_COMM_PATTERN``: DeepEP, pplx, NVSHMEM,
vLLM's and SGLang's communicators, ``torch.distributed``'s collectives, ...), is listed as
possible communication, not counted, naming the frame. The reader decodes a frame's name only,
keeps the frames of those libraries and drops the rest, so a trace full of other frames parses
as if they were not there. Synthetic traces built with tests/trace_events.py; the kept
symmetric-memory trace of tests/data/external is real.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from commprof.cli import main
from commprof.traces import event_selection, event_structs
from commprof.traces.column_builder import read_columns
from commprof.traces.comm_rules import resolve_rules
from commprof.traces.metrics import step_metrics
from commprof.traces.possible_comm import COMPUTE_NAMESPACES, outer_name, rule_line
from commprof.traces.trace_parser import RULES, parse_trace
from commprof.traces.trace_rules import PYTHON_COMM_PATTERN
from tests.test_trace_parser import assert_same_parse
from tests.trace_events import NCCL, x

KERNEL = "void kernel_abc<8>(int*)"  # a kernel no rule claims, no communication word
DEEPEP = "deep_ep/buffer.py(412): dispatch"
LINEAR = "torch/nn/modules/linear.py(125): forward"
DISPATCH = "void deep_ep::intranode::dispatch<8, 768>(int4*, float*)"  # a DeepEP rule claims it
SYMM = Path(__file__).parent / "data" / "external" / "tracelens_b200_eager" / "eager_trace.json.gz"


def _kernel(name: str, ts: float, dur: float, corr: int, **args: Any) -> dict[str, Any]:
    event = x(name, "kernel", ts, dur, 20, correlation=corr, **args)
    event["pid"] = 0
    return event


def _launch(name: str, at: float, corr: int, tid: int = 1, **args: Any) -> list[dict[str, Any]]:
    """A cudaLaunchKernel at ``at`` on thread ``tid`` and its kernel, 100 us later, 30 us."""
    return [
        x("cudaLaunchKernel", "cuda_runtime", at, 4.0, tid, correlation=corr),
        _kernel(name, at + 100.0, 30.0, corr, **args),
    ]


def _trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
        "traceEvents": [x("ProfilerStep#1", "user_annotation", 0.0, 5000.0), *events],
    }


def _listed(p: Any) -> dict[str, dict[str, Any]]:
    assert p.possible_comm is not None
    return {r["name"]: r for r in p.possible_comm.to_dict("records")}


def test_a_kernel_launched_inside_a_communication_library_frame_is_listed_naming_it() -> None:
    t = _trace([x(DEEPEP, "python_function", 100.0, 50.0), *_launch(KERNEL, 110.0, 1)])
    p = parse_trace(t)
    listed = _listed(p)
    assert list(listed) == [KERNEL]
    assert listed[KERNEL]["why"] == f"1 launched inside {DEEPEP}"
    assert listed[KERNEL]["time_ns"] == 30_000 and listed[KERNEL]["num_events"] == 1
    assert listed[KERNEL]["rule_line"] == rule_line(KERNEL)
    assert int(step_metrics(p)["comm_ns"].iat[0]) == 0  # listing counts nothing


def test_the_same_kernel_under_a_compute_frame_is_not_listed() -> None:
    t = _trace([x(LINEAR, "python_function", 100.0, 50.0), *_launch(KERNEL, 110.0, 1)])
    p = parse_trace(t)
    assert p.possible_comm is not None and p.possible_comm.empty
    assert LINEAR not in read_columns(t, RULES.values()).names  # dropped by the reader


@pytest.mark.parametrize(
    ("frame", "at", "tid"),
    [((100.0, 50.0), 160.0, 1), ((100.0, 50.0), 90.0, 1), ((100.0, 50.0), 110.0, 2)],
    ids=["after the frame", "before the frame", "on another thread"],
)
def test_a_launch_outside_the_frame_or_on_another_thread_is_not_listed(
    frame: tuple[float, float], at: float, tid: int
) -> None:
    t = _trace([x(DEEPEP, "python_function", *frame), *_launch(KERNEL, at, 1, tid)])
    p = parse_trace(t)
    assert p.possible_comm is not None and p.possible_comm.empty


def test_a_rule_claimed_kernel_under_the_frame_is_counted_not_listed() -> None:
    t = _trace([x(DEEPEP, "python_function", 100.0, 50.0), *_launch(DISPATCH, 110.0, 1)])
    p = parse_trace(t)
    assert p.possible_comm is not None and p.possible_comm.empty
    assert p.collectives["library"].tolist() == ["DeepEP"]
    assert int(step_metrics(p)["comm_ns"].iat[0]) == 30_000


def test_the_innermost_frame_is_named_and_the_other_functions_counted() -> None:
    outer = "vllm/distributed/parallel_state.py(480): all_reduce"
    inner = "vllm/distributed/device_communicators/symm_mem.py(127): all_reduce"
    t = _trace([
        x(outer, "python_function", 100.0, 400.0), x(inner, "python_function", 110.0, 50.0),
        *_launch(KERNEL, 120.0, 1), *_launch(KERNEL, 130.0, 2),  # inside both: the inner
        *_launch(KERNEL, 300.0, 3),  # inside the outer only
    ])  # fmt: skip
    listed = _listed(parse_trace(t))
    assert listed[KERNEL]["why"] == f"3 launched inside {inner} (and 1 other function)"
    assert listed[KERNEL]["num_events"] == 3


def test_both_signals_are_given_where_a_named_kernel_runs_under_a_frame() -> None:
    name = "void mylib::all2all_send_tokens<8>(int4*)"
    t = _trace([
        x("pplx_kernels/all_to_all.py(48): dispatch", "python_function", 100.0, 50.0),
        x("record_param_comms", "cpu_op", 105.0, 20.0), *_launch(name, 110.0, 1),
    ])  # fmt: skip
    why = _listed(parse_trace(t))[name]["why"]
    assert why == (
        "its name reads like communication; 1 launched inside a communication op; "
        "1 launched inside pplx_kernels/all_to_all.py(48): dispatch"
    )


def _many_frames(num: int) -> list[dict[str, Any]]:
    """``num`` frames of compute modules, nested three deep, each around an aten op that
    launches a kernel (a GEMM) and a kernel no rule claims."""
    events: list[dict[str, Any]] = []
    for i in range(num):
        t0 = 100.0 + 20.0 * i
        events += [
            x("torch/nn/modules/module.py(1747): _call_impl", "python_function", t0, 15.0),
            x(LINEAR, "python_function", t0 + 1.0, 13.0),
            x("<built-in method linear of type object at 0x7f3c>", "python_function", t0 + 2, 9),
            x("aten::linear", "cpu_op", t0 + 3.0, 7.0),
            *_launch("sm90_xmma_gemm_bf16", t0 + 4.0, 2 * i + 1),
            *_launch(KERNEL, t0 + 6.0, 2 * i + 2),
        ]
    return events


def test_frames_of_other_modules_leave_the_parse_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = _many_frames(300)
    bare = [e for e in events if e["cat"] != "python_function"]
    path, bare_path = tmp_path / "frames.json", tmp_path / "bare.json"
    path.write_text(json.dumps(_trace(events)))
    bare_path.write_text(json.dumps(_trace(bare)))
    want = parse_trace(bare_path)
    for source in (_trace(events), path):
        for chunk_bytes in (300, 1 << 18):
            got = parse_trace(source, chunk_bytes=chunk_bytes)
            assert_same_parse(got, want)
            assert got.possible_comm is not None and got.possible_comm.empty
            assert got.counted.equals(want.counted)
    cols = read_columns(path, RULES.values())
    assert "python_function" not in cols.cats
    assert cols.names == read_columns(bare_path, RULES.values()).names
    # As the reader was before it read Python frames: the frames skipped undecoded.
    monkeypatch.setattr(event_selection, "reads_python_functions", lambda tables: False)
    assert_same_parse(parse_trace(path), want)


@pytest.mark.parametrize("chunk_bytes", [1, 97, 300, 1 << 18])
def test_a_frame_after_chunks_of_other_frames_is_read_whole(
    tmp_path: Path, chunk_bytes: int
) -> None:
    # The reader decodes frames by name only until a chunk holds a communication library's:
    # that chunk is decoded again, whole, and so is every later one.
    late = [x(DEEPEP, "python_function", 7000.0, 50.0), *_launch(KERNEL, 7010.0, 9001)]
    later = [x(DEEPEP, "python_function", 7100.0, 50.0), *_launch(KERNEL, 7110.0, 9002)]
    events = [*_many_frames(200), *late, *_many_frames(20), *later]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace(events)))
    from_dict = parse_trace(_trace(events))
    got = parse_trace(path, chunk_bytes=chunk_bytes)
    assert_same_parse(got, from_dict)
    for p in (got, from_dict):
        assert _listed(p)[KERNEL]["why"] == f"2 launched inside {DEEPEP}"
    cols = read_columns(path, RULES.values(), chunk_bytes=chunk_bytes)
    assert [n for n in cols.names if str(n).endswith(".py(412): dispatch")] == [DEEPEP]


def test_settled_names_decode_by_the_known_ones_and_a_new_name_still_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once chunks in a row bear no new frame name, frames are decoded against the known names
    # (no string built); a chunk with another name (an object address, then DeepEP) fails that
    # decoder and is read by name again: nothing is lost either way.
    known: list[int] = []
    know = event_structs.TaggedTypes.know

    def spy(self: Any, names: tuple[str, ...]) -> None:
        known.append(len(names))
        know(self, names)

    monkeypatch.setattr(event_structs.TaggedTypes, "know", spy)
    address = x("<built-in method numel of Tensor object at 0x7f00aa>", "python_function", 1, 1)
    events = [
        *_many_frames(150), address, *_many_frames(150), x(DEEPEP, "python_function", 9000.0, 50),
        *_launch(KERNEL, 9010.0, 9001), *_many_frames(30),
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace(events)))
    got = parse_trace(path, chunk_bytes=400)
    assert known[:2] == [3, 4]  # the three compute frames; then with the address
    assert_same_parse(got, parse_trace(_trace(events)))
    assert _listed(got)[KERNEL]["why"] == f"1 launched inside {DEEPEP}"
    bare = [e for e in events if e["cat"] != "python_function" or e["name"] == DEEPEP]
    assert_same_parse(got, parse_trace(_trace(bare)))


@pytest.mark.parametrize(
    ("kernel", "outer"),
    [
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>"
         "(c10::BFloat16*, unsigned long)", "void anonymous_namespace::multimem_all_reduce_kernel"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
         "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>)",
         "void at::native::vectorized_elementwise_kernel"),
        ("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
         "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*)",
         "std::enable_if::type vllm::fused_add_rms_norm_kernel"),
        ("nvjet_tst_64x64_64x16_2x1_v_bz_TNT", "nvjet_tst_64x64_64x16_2x1_v_bz_TNT"),
    ],
)  # fmt: skip
def test_compute_namespaces_are_looked_for_outside_template_arguments(
    kernel: str, outer: str
) -> None:
    assert outer_name(kernel) == outer
    assert (COMPUTE_NAMESPACES.search(outer_name(kernel)) is not None) is ("at::" in outer)


@pytest.mark.parametrize(
    ("name", "matched"),
    [
        (DEEPEP, True), ("/home/u/DeepEP/deep_ep/buffer.py(880): low_latency_dispatch", True),
        ("deep_ep/buffers/ep.py(10): combine", True),
        ("pplx_kernels/all_to_all.py(48): dispatch", True),
        ("pplx_garden/kernels/p2p_all_to_all.py(99): dispatch", True),
        ("nvshmem/core/collective.py(120): reduce", True), ("mscclpp/comm.py(30): f", True),
        ("flashinfer/comm/trtllm_ar.py(700): trtllm_allreduce_fusion", True),
        ("vllm/distributed/device_communicators/symm_mem.py(127): all_reduce", True),
        ("sglang/srt/distributed/parallel_state.py(500): all_reduce", True),
        ("torch/distributed/distributed_c10d.py(3953): all_gather_into_tensor", True),
        ("torch/distributed/_functional_collectives.py(161): all_reduce", True),
        ("torch/distributed/_symmetric_memory/__init__.py(700): _fused_all_gather_matmul", True),
        ("torch/distributed/nn/functional.py(200): all_reduce", True),
        ("torch/cuda/nccl.py(60): all_reduce", True),
        ("transformer_engine/pytorch/module/base.py(520): fill_userbuffers_buffer_for_all_gather",
         True),
        ("deepspeed/comm/comm.py(500): all_reduce", True),
        ("megatron/core/tensor_parallel/mappings.py(30): _reduce", True),
        ("torchrec/distributed/comm_ops.py(400): alltoall_pooled", True),
        (r"C:\env\Lib\site-packages\deep_ep\buffer.py(412): dispatch", True),
        (LINEAR, False), ("torch/nn/parallel/distributed.py(1600): forward", False),
        ("torch/distributed/fsdp/_fully_shard/_fsdp_state.py(230): _pre_forward", False),
        ("torch/distributed/tensor/_dispatch.py(160): dispatch", False),
        ("torch/distributed/_functional_collectives.py(1129): __torch_dispatch__", False),
        ("transformer_engine/pytorch/module/base.py(900): forward", False),
        ("vllm/model_executor/layers/fused_moe/config.py(812): use_pplx_kernels", False),
        ("sglang/srt/layers/moe/token_dispatcher/deepep.py(300): dispatch", False),
        ("<built-in method all_reduce of PyCapsule object at 0x7f00>", False),
        ("my_deep_ep/buffer.py(1): dispatch", False), ("model.py(212): forward", False),
    ],
)  # fmt: skip
def test_python_function_names_of_communication_libraries(name: str, matched: bool) -> None:
    assert (re.match(PYTHON_COMM_PATTERN, name) is not None) is matched


def test_cli_lists_the_frame_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    t = _trace([x(DEEPEP, "python_function", 100.0, 50.0), *_launch(KERNEL, 110.0, 1)])
    (folder / "rank0.json").write_text(json.dumps(t))
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["why"]) for r in doc["possible_comm"]] == [
        (KERNEL, f"1 launched inside {DEEPEP}")
    ]
    assert doc["traces"][0]["possible_comm_ns"] == 30_000
    assert main(["analyze", str(folder)]) == 0
    text = capsys.readouterr().out
    section = text.split("Possible communication, not counted")[1]
    assert DEEPEP in section and rule_line(KERNEL) in section


def test_a_real_symmetric_memory_kernel_without_its_rule_is_listed_under_vllm(
    tmp_path: Path,
) -> None:
    # The kept B200 vLLM trace (with_stack): its 73 multimem all-reduces are launched inside
    # vllm/distributed/device_communicators/symm_mem.py(127): all_reduce. With the rule that
    # claims them switched off, they are listed for their name and for that frame.
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - {name: torch-symmetric-memory, library: x, pattern: '^no such kernel$', "
        "kind: collective, type_from: name, source: test}\n"
    )
    with pytest.warns(UserWarning, match="no ProfilerStep#N annotations"):
        p = parse_trace(SYMM, comm_rules=resolve_rules(rules))
    assert p.possible_comm is not None
    (row,) = [r for r in p.possible_comm.to_dict("records") if "multimem" in r["name"]]
    assert row["num_events"] == 73
    assert row["why"] == (
        "its name reads like communication; 73 launched inside "
        "vllm/distributed/device_communicators/symm_mem.py(127): all_reduce"
    )
    assert list(p.collectives["library"].unique()) == ["NCCL / RCCL"]  # the all-gather
    assert NCCL not in set(p.possible_comm["name"])
