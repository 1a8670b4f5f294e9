"""Communication rules as data: the shipped file, a user's file, and what no rule claims.

The synthetic traces use kernel names copied from a public DeepEP training trace
(deepseek-ai/profile-data train.json; tests/data/external/SOURCES.md) and the helpers of
tests/trace_events.py; the real trace itself is read where a local copy exists.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from commprof.cli import main
from commprof.traces.comm_rules import (
    ENV_VAR,
    KINDS,
    default_rules,
    load_rule_file,
    resolve_rules,
)
from commprof.traces.metrics import collective_type_metrics, step_metrics
from commprof.traces.possible_comm import rule_line
from commprof.traces.trace_parser import load_trace, parse_trace
from tests.trace_events import x

# Kernel names as the DeepEP training trace writes them (shortened argument lists).
DISPATCH = "void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*)"
COMBINE = "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)"
LAYOUT = "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*)"
GEMM = "void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(x)"
UNKNOWN_EP = "void mylib::moe::all2all_send_tokens<8>(int4*, int)"
HIDDEN = "void mylib::pack_for_peer<4>(int4*)"  # launched inside record_param_comms
REQUIRED_LIBRARIES = {
    "NCCL", "DeepEP", "NVSHMEM", "Transformer Engine userbuffers", "NCCL device API",
    "pplx-kernels", "FlashInfer", "MSCCL", "MSCCL++", "UCC", "oneCCL", "HCCL", "vLLM",
    "TensorRT-LLM", "PyTorch symmetric memory",
}  # fmt: skip
EXTERNAL = Path(os.environ.get("COMMPROF_EXTERNAL_TRACES", "")) / "deepseek_profile_data"
"""A local copy of deepseek-ai/profile-data's train.json (no licence: not kept here, so no clone
has it); the folder of such copies is ``COMMPROF_EXTERNAL_TRACES`` (tests/data/external/SOURCES.md).
The test that reads it is opt-in: it runs where that variable names a copy, anywhere else it
skips, CI included (a plain clone cannot hold the file)."""


def ep_trace() -> dict[str, Any]:
    """One step: a GEMM [0, 400) us, dispatch [100, 300), combine [350, 600), the layout kernel,
    an unknown all2all kernel [700, 750) and a kernel launched inside record_param_comms
    [800, 820); every kernel launched by a cudaLaunchKernel at its start minus 50 us."""
    events = [x("ProfilerStep#1", "user_annotation", -60.0, 1000.0)]
    kernels = [(GEMM, 0.0, 400.0), (DISPATCH, 100.0, 200.0), (COMBINE, 350.0, 250.0),
               (LAYOUT, 610.0, 5.0), (UNKNOWN_EP, 700.0, 50.0), (HIDDEN, 800.0, 20.0)]  # fmt: skip
    for corr, (name, ts, dur) in enumerate(kernels, 1):
        if name == HIDDEN:
            events.append(x("record_param_comms", "cpu_op", ts - 55.0, 10.0))
        events.append(x("cudaLaunchKernel", "cuda_runtime", ts - 50.0, 4.0, correlation=corr))
        kernel = x(name, "kernel", ts, dur, 7 if name == GEMM else 20, correlation=corr)
        kernel["pid"] = 0
        events.append(kernel)
    return {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 64},
            "traceEvents": events}  # fmt: skip


def test_shipped_rules_cover_the_libraries_and_name_their_sources() -> None:
    rules = default_rules().rules
    libraries = {lib.strip() for r in rules for lib in r.library.split("/")}
    assert libraries >= REQUIRED_LIBRARIES
    assert "RCCL" in libraries
    for r in rules:
        assert r.kind in KINDS and re.search(r"@ [0-9a-f]{40}", r.source), r.name


@pytest.mark.parametrize(
    ("kernel", "rule", "kind"),
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl", None),
        ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32(ncclSymkDevWorkArgs4K)", "nccl-symmetric",
         None),
        (DISPATCH, "deepep-dispatch", "dispatch"),
        (COMBINE, "deepep-combine", "combine"),
        ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*)", "deepep-dispatch",
         "dispatch"),
        ("void dpsk::ep::internode::dispatch_ll<1>(int)", "deepep-dispatch", "dispatch"),
        ("void deep_ep::intranode::notify_dispatch<8>(int const*)", "deepep-notify-dispatch",
         "dispatch"),
        (LAYOUT, "deepep-layout", None),
        ("void pplx::(anonymous namespace)::dispatchKernel<32>(int)", "pplx-dispatch", "dispatch"),
        ("userbuffers_fp16_sum_inplace_gpu_rr_rs<8>(int)", "te-userbuffers-reduce-scatter",
         "reduce_scatter"),
        ("kuserbuffers_pushsend(int*)", "te-userbuffers-p2p", "send_recv"),
        ("void mscclpp::collective::allreduceRsAg<float>(float*)", "mscclpp", None),
        ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<x>()",
         "flashinfer-all-reduce", "all_reduce"),
        ("multimem_all_reduce_kernel", "torch-symmetric-memory", None),
    ],
)  # fmt: skip
def test_shipped_rules_claim_real_kernel_names(kernel: str, rule: str, kind: str | None) -> None:
    claimed = default_rules().claim(kernel)
    assert claimed is not None and claimed.name == rule
    assert claimed.collective_type == kind
    assert default_rules().claim(GEMM) is None


def test_deepep_kernels_count_as_dispatch_and_combine_with_exposed_time() -> None:
    p = parse_trace(ep_trace())
    types = collective_type_metrics(p).set_index("collective_type")
    # dispatch [100, 300) lies under the GEMM [0, 400): all overlapped. combine [350, 600):
    # 50 us under the GEMM, 200 us exposed (the same definitions as all-reduce).
    assert types.loc["dispatch", "comm_ns"] == 200_000
    assert types.loc["dispatch", "exposed_ns"] == 0
    assert types.loc["combine", "comm_ns"] == 250_000
    assert types.loc["combine", "overlap_ns"] == 50_000
    assert types.loc["combine", "exposed_ns"] == 200_000
    colls = p.collectives.set_index("name")
    assert set(colls["library"]) == {"DeepEP"} and set(colls["type_source"]) == {"rule"}
    steps = step_metrics(p)
    assert int(steps["comm_ns"].iat[0]) == 200_000 + 250_000
    assert int(steps["exposed_ns"].iat[0]) == 200_000


def test_unclaimed_communication_is_listed_with_its_time_and_rule_line() -> None:
    p = parse_trace(ep_trace())
    assert p.possible_comm is not None
    listed = p.possible_comm.set_index("name")
    # The layout kernel is claimed (a rule says it computes); the GEMM is a compute library's.
    assert set(listed.index) == {UNKNOWN_EP, HIDDEN}
    assert listed.loc[UNKNOWN_EP, "time_ns"] == 50_000
    assert "name reads like communication" in listed.loc[UNKNOWN_EP, "why"]
    assert listed.loc[HIDDEN, "time_ns"] == 20_000
    assert "launched inside a communication op" in listed.loc[HIDDEN, "why"]
    # Listing counts nothing: both stay compute.
    assert int(step_metrics(p)["comm_ns"].iat[0]) == 450_000


def test_the_suggested_line_counts_the_kernel_once_added(tmp_path: Path) -> None:
    line = rule_line(UNKNOWN_EP)
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  " + line.replace("<repository path @ commit>", "mine") + "\n")
    comm = resolve_rules(rules)
    assert comm.rules[0].library == "mylib" and comm.claim(UNKNOWN_EP) is comm.rules[0]
    p = parse_trace(ep_trace(), comm_rules=comm)
    assert p.possible_comm is not None and set(p.possible_comm["name"]) == {HIDDEN}
    types = collective_type_metrics(p).set_index("collective_type")
    assert types.loc["all_to_all", "comm_ns"] == 50_000  # "all2all" in its name
    assert int(step_metrics(p)["comm_ns"].iat[0]) == 500_000


def test_a_user_entry_overrides_a_shipped_one_by_name(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n"
        "  - name: deepep-combine\n    library: DeepEP\n    pattern: 'dpsk::ep::\\w+::combine'\n"
        "    kind: not_communication\n    type_from: name\n    source: test\n"
    )
    comm = resolve_rules(rules)
    assert len(comm.rules) == len(default_rules().rules)
    p = parse_trace(ep_trace(), comm_rules=comm)
    assert set(collective_type_metrics(p)["collective_type"]) == {"dispatch"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("rules: 3\n", "a 'rules' list"),
        ("rules:\n  - name: a\n", "missing key(s) ['library', 'pattern'"),
        ("rules:\n  - {name: a, library: b, pattern: 'x(', kind: collective, type_from: name, "
         "source: s}\n", "pattern 'x(' is no regular expression"),
        ("rules:\n  - {name: a, library: b, pattern: x, kind: colective, type_from: name, "
         "source: s}\n", "kind must be one of"),
        ("rules:\n  - {name: a, library: b, pattern: x, kind: collective, type_from: fixed, "
         "source: s}\n", "collective_type is required"),
        ("rules:\n  - {name: a, library: b, pattern: x, kind: collective, type_from: name, "
         "source: s, colour: red}\n", "unknown key(s) ['colour']"),
        ("rules:\n  - {name: a, library: b, pattern: x, kind: collective, type_from: fixed, "
         "collective_type: allreduce, source: s}\n", "collective_type must be one of"),
        ("rules:\n  - !!python/object:os.system {}\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_bad_rule_files_name_file_entry_and_key(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(says)) as err:
        load_rule_file(path)
    assert str(path) in str(err.value)
    if "rules[0]" in str(err.value):
        assert "rules[0] (a)" in str(err.value)


def test_cli_rules_flag_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json").write_text(json.dumps(ep_trace()))
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in doc["possible_comm"]} == {UNKNOWN_EP, HIDDEN}
    assert doc["traces"][0]["possible_comm_ns"] == 70_000
    assert any("may be communication that no rule claims" in n for n in doc["notes"])
    assert main(["analyze", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "Possible communication, not counted" in text and rule_line(HIDDEN) in text
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  " + rule_line(UNKNOWN_EP).replace("<repository path @ commit>", "x")
    )
    monkeypatch.setenv(ENV_VAR, str(rules))
    assert main(["analyze", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in doc["possible_comm"]} == {HIDDEN}
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - {name: a}\n")
    assert main(["analyze", str(folder), "--rules", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "missing key(s)" in err
    monkeypatch.setenv(ENV_VAR, str(bad))
    assert main(["analyze", str(folder)]) == 2
    assert f"{ENV_VAR}={bad}" in capsys.readouterr().err


@pytest.mark.skipif(
    not os.environ.get("COMMPROF_EXTERNAL_TRACES") or not EXTERNAL.is_dir(),
    reason="opt-in: set COMMPROF_EXTERNAL_TRACES to a folder holding deepseek_profile_data/",
)
def test_public_deepep_training_trace_counts_every_deepep_kernel() -> None:
    path = EXTERNAL / "train.json"
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ep = [e for e in kernels if "dpsk::ep::internode::" in e["name"]]
    p = parse_trace(path)
    assert len(p.collectives) == len(ep) > 0
    assert set(p.collectives["library"]) == {"DeepEP"}
    assert set(p.collectives["collective_type"]) == {"dispatch", "combine", "all_to_all"}
    assert p.possible_comm is not None and p.possible_comm.empty
    assert int(p.collectives["duration_ns"].sum()) == sum(round(e["dur"] * 1000) for e in ep)


def test_kept_symmetric_memory_trace_counts_every_communication_kernel() -> None:
    path = (
        Path(__file__).parent / "data" / "external" / "tracelens_b200_eager" / "eager_trace.json.gz"
    )
    events = load_trace(path)["traceEvents"]
    comm = [e for e in events if isinstance(e, dict) and e.get("cat") == "kernel"
            and re.search(r"multimem_all_reduce_kernel|^ncclDevKernel", e["name"])]  # fmt: skip
    with pytest.warns(UserWarning, match="no ProfilerStep#N annotations"):
        p = parse_trace(path)
    assert p.regime == "cuda-nccl" and len(p.collectives) == len(comm) == 74
    by_library = p.collectives.groupby("library", observed=True)["collective_type"].agg(set)
    assert by_library.to_dict() == {
        "PyTorch symmetric memory": {"all_reduce"},
        "NCCL / RCCL": {"all_gather"},
    }
    assert p.possible_comm is not None and p.possible_comm.empty
