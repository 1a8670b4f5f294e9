"""Every third-party trace set in ../shared/realtraces parses, with the right windows and rules.

The sets come from public projects (SOURCES.txt there names them); they are read in place.
"""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from commprof.traces.analyze import analyze_dir
from commprof.traces.intervals import total_length
from commprof.traces.metrics import collective_type_metrics, step_metrics, trace_overlap
from commprof.traces.trace_parser import ParsedTrace, load_trace, parse_trace
from commprof.traces.trace_rules import LAUNCH_CATS, LAUNCHED_CATS
from tests.prereqs import REALTRACES, needs

REAL = REALTRACES
SETS = sorted([
    "hta_a100_r0of16", "hta_alexnet_nostep", "hta_amd_mi250_single", "hta_cpu_only_gloo",
    "hta_dfindex_r1of2", "hta_nccl_parser_r0of2", "hta_ns_resolution_single",
    "hta_sampled_2of128", "hta_tracediff_control_r3of8", "hta_tracediff_test_r1of2",
    "param_dlrm_8rank",
])  # fmt: skip
"""The sets of ../shared/realtraces (its SOURCES.txt names them), read in place."""
pytestmark = needs(REAL)
REGIME = {"hta_cpu_only_gloo": "cpu-gloo", "hta_alexnet_nostep": "cuda-single",
          "hta_amd_mi250_single": "cuda-single"}  # fmt: skip
"""Sets not in cuda-nccl: CPU-only gloo, and single-GPU traces with no collective."""


def files(name: str) -> list[Path]:
    return sorted(p for p in (REAL / name).iterdir() if p.name.endswith((".json", ".json.gz")))


@cache
def parsed(path: Path, unlaunched: str = "keep") -> ParsedTrace:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no-ProfilerStep and window-source notes
        return parse_trace(path, unlaunched=unlaunched)


def test_all_eleven_sets_are_present() -> None:
    assert sorted(p.name for p in REAL.iterdir() if p.is_dir()) == SETS


@pytest.mark.parametrize("name", SETS)
def test_every_set_parses_with_sane_steps(name: str) -> None:
    for path in files(name):
        p = parsed(path)
        assert p.regime == REGIME.get(name, "cuda-nccl")
        steps = step_metrics(p)  # checks compute + exposed + idle + other == window itself
        assert len(steps) == len(p.step_ids) >= 1
        assert (steps["window_source"] == p.step_source).all()
        assert steps["compute_ns"].sum() > 0 or p.regime == "cpu-gloo"
        # A step that holds a collective has communication time (the ROCm device-window
        # bug read comm 0 in every step while every collective fell outside the windows).
        with_coll = set(p.collectives["step"].dropna().astype(int))
        assert (steps.set_index("step").loc[sorted(with_coll), "comm_ns"] > 0).all()
        types = collective_type_metrics(p)
        in_steps = p.collectives[p.collectives["step"].notna()]
        assert types["num_collectives"].sum() == len(in_steps)
        assert set(types["collective_type"]) == set(in_steps["collective_type"])
        assert (types["overlap_ns"] + types["exposed_ns"] == types["comm_ns"]).all()


def test_rocm_steps_follow_the_launches_not_the_device_step_annotations() -> None:
    # MI250 ROCm 6.2: gpu_user_annotation ProfilerStep#1 is 1.0 ms long where the CPU step
    # is 9.3 ms, and holds half the kernel time; the windows follow the launches instead.
    path = files("hta_amd_mi250_single")[0]
    p = parse_trace(path)
    assert p.step_source == "ProfilerStep launches"
    assert p.regime == "cuda-single" and p.world_size == 1 and p.has_backward
    steps = step_metrics(p).set_index("step")
    # Every kernel of the trace was launched in step 1 (step 2 is a 49 us stub).
    assert steps.loc[1, "compute_ns"] == total_length(p.classes["compute"])
    kernels = [e for e in load_trace(path)["traceEvents"] if e.get("cat") == "kernel"]
    first = min(round(e["ts"] * 1000) for e in kernels)
    last = max(round(e["ts"] * 1000) + round(e["dur"] * 1000) for e in kernels)
    memcpy = [e for e in load_trace(path)["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    first = min([first, *(round(e["ts"] * 1000) for e in memcpy)])
    last = max([last, *(round(e["ts"] * 1000) + round(e["dur"] * 1000) for e in memcpy)])
    assert (p.step_start_ns[0], p.step_end_ns[0]) == (first, last)


@pytest.mark.parametrize(
    "name", ["hta_a100_r0of16", "hta_tracediff_test_r1of2", "hta_sampled_2of128"]
)
def test_unlaunched_kernels_counted_kept_or_dropped(name: str) -> None:
    path = files(name)[0]
    # Independent count from the plain events: device activities whose correlation id
    # matches no runtime (launch) event.
    events = [e for e in load_trace(path)["traceEvents"] if isinstance(e, dict)]
    launches = {
        e["args"].get("correlation")
        for e in events
        if e.get("cat") in LAUNCH_CATS and isinstance(e.get("args"), dict)
    } - {-1, None}
    orphans = [e for e in events if e.get("ph") == "X" and e.get("cat") in LAUNCHED_CATS
               and e.get("args", {}).get("correlation", -1) not in launches]  # fmt: skip
    keep, drop = parsed(path), parsed(path, "drop")
    assert keep.num_unlaunched == drop.num_unlaunched == len(orphans)
    assert keep.unlaunched_ns == sum(round(e["dur"] * 1000) for e in orphans)
    comm_keep, _ = trace_overlap(keep)
    comm_drop, _ = trace_overlap(drop)
    assert (keep.unlaunched_rule, drop.unlaunched_rule) == ("keep", "drop")
    assert comm_keep >= comm_drop
    assert (comm_keep == comm_drop) == (keep.unlaunched_comm_ns == 0)
    if not orphans:
        assert np.array_equal(keep.classes["compute"].starts, drop.classes["compute"].starts)


def test_analyze_reports_window_source_and_unlaunched_per_trace() -> None:
    tables = analyze_dir(REAL / "hta_sampled_2of128")
    traces = tables["traces"].set_index("rank")
    assert sorted(traces.index) == [0, 1]
    assert (traces["window_source"] == "ProfilerStep launches").all()
    assert (traces["unlaunched_rule"] == "keep").all()
    types = tables["collective_types"]
    # Every kernel is ncclKernel_SendRecv; its launching op (nccl:all_reduce,
    # nccl:all_to_all, nccl:_all_gather_base on the launching thread) names the collective.
    colls = tables["collectives"]
    assert colls["name"].str.startswith("ncclKernel_SendRecv").all()
    assert (colls["type_source"] == "op name").all()
    assert set(types["collective_type"]) == {"all_reduce", "all_to_all", "all_gather"}
    # The per-type table adds up to the step table: all communication is collectives.
    totals = tables["type_totals"].set_index(["rank", "step"])
    steps = tables["steps"].set_index(["rank", "step"])
    assert (totals["comm_ns"] == steps.loc[totals.index, "comm_ns"]).all()
    assert (totals["collective_ns"] == totals["comm_ns"]).all()
    summed = types.groupby(["rank", "step"])["comm_ns"].sum()
    assert (summed == totals.loc[summed.index, "types_sum_ns"]).all()


def test_cli_unlaunched_drop_is_htas_rule(capsys: pytest.CaptureFixture[str]) -> None:
    from commprof.cli import main

    folder = REAL / "hta_tracediff_test_r1of2"
    assert main(["analyze", str(folder), "--json", "--unlaunched", "drop"]) == 0
    dropped = json.loads(capsys.readouterr().out)
    assert main(["analyze", str(folder), "--json"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in dropped["steps"]] == [r["step"] for r in kept["steps"]]
    # The 614 launch-less kernels (22.3 ms of them communication) only add comm time.
    assert sum(r["comm_ns"] for r in kept["steps"]) > sum(r["comm_ns"] for r in dropped["steps"])
    assert main(["analyze", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "Per collective type (durations in ms" in out and "num_unlaunched" in out


@pytest.mark.parametrize("name", ["param_dlrm_8rank", "hta_sampled_2of128"])
def test_perfetto_of_real_multi_rank_sets(name: str, tmp_path: Path) -> None:
    from commprof.traces.analyze import analyze, perfetto

    a = analyze(REAL / name, workers=1)
    assert a.cross is not None
    out = tmp_path / "all.json"
    done = perfetto(a, out)
    events = json.loads(out.read_text())["traceEvents"]
    ranks = sorted(a.files)
    assert {e["pid"] for e in events} == set(ranks) and done["own_clock_ranks"] == []
    flows = [e for e in events if e.get("cat") == "commprof_collective"]
    starts = [e for e in flows if e["ph"] == "s"]
    assert len(starts) == done["num_linked_collectives"] == len(a.cross.collectives)
    # Each flow passes through one kernel of each rank of its collective; on the merged clock the
    # kernels' ends meet within the line-up's largest residual (both sides of the median).
    residual_us = int(a.cross.offsets["residual_max_ns"].max()) / 1000
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    by_id: dict[int, list[float]] = {}
    for e in flows:
        around = [end for lo, end in slices[(e["pid"], e["tid"])] if lo <= e["ts"] <= end]
        assert around, e
        by_id.setdefault(e["id"], []).append(min(around))
    sizes = a.cross.collectives["num_ranks"].sort_values().tolist()
    assert sorted(len(v) for v in by_id.values()) == sizes
    if not a.cross.matching_doubtful():  # 2 of 128 ranks' send/recv: ends need not meet
        assert all(max(v) - min(v) <= 2 * residual_us + 0.01 for v in by_id.values())
    assert a.cross.matching_doubtful() == (name == "hta_sampled_2of128")
