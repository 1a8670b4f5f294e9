"""``commprof estimate --trace DIR --bucket-cap-mb MB``: a new bucket cap laid out over a trace's
own gradients. Closed-form replays of a hand-built GPU step, the real gloo traces of
tests/data/golden_gloo2 (recorded at 0.25 MiB), and the refusals that name why."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from commprof.cli import main
from commprof.modeling.buckets import MIB
from commprof.modeling.trace_whatif.buckets import (
    OwnBuckets,
    fit_bucket_cost,
    launch_delays,
    new_layout,
    own_buckets,
    own_cap_range,
    own_layout,
)
from commprof.modeling.trace_whatif.replay import Layout, StepTimeline, read_timelines, replay
from commprof.traces.gradients import read_step_gradients
from tests.prereqs import REALTRACES, needs
from tests.trace_events import x

US = 1000
"""ns per us."""
GRAD_NUMEL = MIB // 16
"""Elements of each hand-built gradient: a quarter MiB of float32."""
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GOLDEN = Path(__file__).parent / "data" / "golden_gloo2"


def launch(ts: float, corr: int, tid: int = 2) -> dict[str, Any]:
    return x("cudaLaunchKernel", "cuda_runtime", ts, 0.5, tid, correlation=corr)


def gpu_step(
    *, late_gradient: bool = False, sized: bool = True, adam_at: float = 700.0,
    kernel_at: tuple[float, ...] = (0.0, 100.0, 200.0, 300.0), dtype: str = "float",
) -> dict[str, Any]:  # fmt: skip
    """One step [0, 1000) us on the GPU. The backward thread (tid 2) launches four gradient
    kernels (device [0, 100), [100, 200), [200, 300), [300, 400)), writes each gradient
    (AccumulateGrad, a quarter MiB) just after, and launches two buckets after the second and
    the fourth: all-reduces [250, 450) and [450, 680) (the second queued behind the first).
    The optimizer [700, 800) waited on the last; the step's window ends with it
    (``commprof analyze`` ends a GPU step window at its last kernel)."""
    grad = {"Input Dims": [[GRAD_NUMEL]], "Input type": [dtype]}
    sized_args = {"In msg nelems": 2 * GRAD_NUMEL, "dtype": "Float"} if sized else {}
    coll = {"Collective name": "allreduce", "Group size": 2, **sized_args}
    events = [x("ProfilerStep#1", "user_annotation", 0.0, 1000.0, 1)]
    for k in range(4):
        events += [
            launch(9.0 + 10 * k, k + 1),
            x("gemm_backward", "kernel", kernel_at[k], 100.0, 7, correlation=k + 1),
            x("torch::autograd::AccumulateGrad", "cpu_op", 10.0 + 10 * k, 1.0, 2, **grad),
        ]
    events += [
        x("c10d::allreduce_", "cpu_op", 21.0, 2.0, 2),
        launch(21.5, 5),
        x(NCCL, "kernel", 250.0, 200.0, 20, correlation=5, **coll),
        x("c10d::allreduce_", "cpu_op", 41.0, 2.0, 2),
        launch(41.5, 6),
        x(NCCL, "kernel", 450.0, 230.0, 20, correlation=6, **coll),
        launch(45.0, 7, tid=1),
        x("adam_step", "kernel", adam_at, 100.0, 7, correlation=7),
    ]
    if late_gradient:
        events.append(x("torch::autograd::AccumulateGrad", "cpu_op", 50.0, 1.0, 2, **grad))
    return {
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
        "traceEvents": events,
    }


def write(tmp_path: Path, trace: dict[str, Any]) -> Path:
    folder = tmp_path / "trace"
    folder.mkdir(parents=True)
    (folder / "rank0.json").write_text(json.dumps(trace))
    return folder


def step_of(tmp_path: Path, **kw: Any) -> StepTimeline:
    (step,) = read_timelines(write(tmp_path, gpu_step(**kw)), gradients=True)
    return step


def test_gradients_are_ready_when_their_kernel_ends_on_the_device(tmp_path: Path) -> None:
    folder = write(tmp_path, gpu_step())
    g = read_step_gradients(folder / "rank0.json", rank=0)[1]
    assert g.unsized == () and g.thread == 2
    assert g.num_bytes.tolist() == [4 * GRAD_NUMEL] * 4
    assert (g.ready_ns // US).tolist() == [100, 200, 300, 400]  # not the host's 11, 21, 31, 41
    assert (g.launch_ns // US).tolist() == [21, 41]
    assert g.trace_bucket.tolist() == [0, 0, 1, 1]


def test_own_buckets_replayed_as_measured_give_the_step_back(tmp_path: Path) -> None:
    step = step_of(tmp_path)
    own = own_buckets(step)
    assert own.num_bytes.tolist() == [MIB // 2, MIB // 2]  # = the all-reduces' own sizes
    assert (own.ready_ns // US).tolist() == [200, 400]
    assert launch_delays(step, own) == [50 * US]  # 250 - 200; the second queued
    low, high = own_cap_range(step, own)
    assert low == 0.25 and high == float("inf")  # the last bucket: only size - last < cap
    mine = replay(step, None, own_layout(step, own, 50 * US, Layout))
    assert (step.measured_step_ns, step.measured_exposed_ns) == (800 * US, 280 * US)
    assert (mine.step_ns, mine.exposed_ns) == (800 * US, 280 * US)


@pytest.mark.parametrize(
    ("cap_mb", "buckets", "step_us", "exposed_us"),
    [
        # one bucket of all four, ready at 400 + 50, 300 us: [450, 750); the optimizer waited
        # on the last bucket: 750 + its measured 20 us resume -> [770, 870)
        (1.0, 1, 870, 300),
        # four buckets of one gradient, 100 us each from ready 150, 250, 350, 450: the last
        # ends 550; the optimizer [570, 670); exposed [400, 550)
        (0.25, 4, 670, 150),
    ],
)
def test_a_new_cap_replays_in_closed_form(
    tmp_path: Path, cap_mb: float, buckets: int, step_us: int, exposed_us: int
) -> None:
    step = step_of(tmp_path)
    own = own_buckets(step)
    took = 300 * US if buckets == 1 else 100 * US

    def cost(num_bytes: np.ndarray) -> np.ndarray:
        return np.full(num_bytes.size, float(took))

    layout, n = new_layout(step, own, cap_mb, cost, 50 * US, Layout)
    assert n == buckets
    out = replay(step, None, layout)
    assert (out.step_ns, out.exposed_ns) == (step_us * US, exposed_us * US)


def constant(ns: float) -> Any:
    def cost(num_bytes: np.ndarray) -> np.ndarray:
        return np.full(num_bytes.size, ns)

    return cost


def test_the_end_of_backward_waits_for_every_new_bucket_whatever_its_measured_gap(
    tmp_path: Path,
) -> None:
    # the optimizer started 120 us after the last bucket ended (host work between): no wait the
    # resume rule can see, yet DDP's end of backward waits on every bucket. One bucket of 500 us
    # ready at 450: [450, 950); the optimizer after it, [950, 1050)
    step = step_of(tmp_path, adam_at=800.0)
    own = own_buckets(step)
    layout, _ = new_layout(step, own, 1.0, constant(500 * US), 50 * US, Layout)
    out = replay(step, None, layout)
    assert out.step_ns == 1050 * US


def test_a_wait_in_backward_on_a_replaced_bucket_goes_with_it(tmp_path: Path) -> None:
    # the fourth gradient's kernel starts 10 us after bucket 0 ended at 450 (the resume rule
    # reads a wait on it); with four buckets of 300 us that kernel must not wait for them
    step = step_of(tmp_path, kernel_at=(0.0, 100.0, 200.0, 460.0), adam_at=900.0)
    own = own_buckets(step)
    layout, n = new_layout(step, own, 0.25, constant(300 * US), 50 * US, Layout)
    out = replay(step, None, layout)
    # compute [0, 300), [460, 560) as measured; buckets ready 150, 250, 350, 610 (the fourth's
    # kernel ends at 560) -> [150, 450), [450, 750), [750, 1050), [1050, 1350); the optimizer
    # waits on the last: its measured resume after the trace's last bucket (680 -> 900) is
    # past RESUME_GAP_NS, so [1350, 1450)
    assert n == 4 and out.step_ns == 1450 * US


def test_gradients_without_a_usable_size_are_refused_naming_it(tmp_path: Path) -> None:
    trace = gpu_step()
    third = [e for e in trace["traceEvents"] if e["name"] == "torch::autograd::AccumulateGrad"][2]
    third["args"]["Input type"] = ["c10::Float4_e2m1"]  # a dtype without a size here
    (step,) = read_timelines(write(tmp_path, trace), gradients=True)
    assert step.gradients is not None and len(step.gradients.unsized) == 1
    with pytest.raises(ValueError, match=r"1 gradient\(s\) .* give no usable size"):
        own_buckets(step)


def test_the_two_layers_queue_rule_is_one_value() -> None:
    from commprof.modeling.trace_whatif import buckets as trace_buckets
    from commprof.modeling.trace_whatif import replay as step_replay

    assert trace_buckets.QUEUED_GAP_NS == step_replay.QUEUED_GAP_NS


def test_a_cap_the_ddp_cannot_take_is_refused_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("inf", "0", "-1"):
        with pytest.raises(SystemExit) as info:  # argparse's, naming the flag
            main(["estimate", "--trace", str(tmp_path / "none"), "--bucket-cap-mb", bad])
        assert info.value.code == 2
        assert "--bucket-cap-mb: the cap must be between 1 byte" in capsys.readouterr().err


def test_bucket_cost_fit_recovers_a_line_and_refuses_one_size() -> None:
    sizes = [1 << 16, 1 << 20, 1 << 24]
    fit = fit_bucket_cost(sizes, [20_000 + 0.1 * s for s in sizes])
    assert fit.alpha_ns == pytest.approx(20_000) and fit.ns_per_byte == pytest.approx(0.1)
    assert fit.mape_pct == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="no two sizes 5 % apart"):
        fit_bucket_cost([1 << 20, 1 << 20], [1, 2])


def test_cli_needs_a_link_where_the_buckets_are_all_one_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write(tmp_path, gpu_step())
    assert main(["estimate", "--trace", str(folder), "--bucket-cap-mb", "1"]) == 2
    assert "give --cluster NAME|FILE or --interconnect NAME" in capsys.readouterr().err
    args = ["--bucket-cap-mb", "1", "--interconnect", "nvlink3", "--json"]
    assert main(["estimate", "--trace", str(folder), *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["steps"]
    assert (row["own_buckets"], row["whatif_buckets"]) == (2, 1)
    assert doc["bucket_cap"]["own_layout_step_diff_pct"] == 0.0
    # NVLink moves one MiB in tens of us, not the trace's 430 us of buckets: the bucket is
    # ready at 400 + 50 (launch delay), the optimizer follows its end by the measured 20 us
    # resume and runs 100 us: the step ends at 570 us plus the all-reduce's time
    assert row["trace_step_ns"] == 800 * US
    assert 570 * US < row["whatif_step_ns"] < 670 * US
    # the trace's two buckets are replaced, not predicted nor kept
    assert doc["what_if"]["num_predicted"] == 0 and doc["what_if"]["num_kept_measured"] == 0


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"late_gradient": True}, "1 gradient(s) written after the step's last bucket launch"),
    ],
)
def test_buckets_that_are_not_ddps_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kw: dict[str, bool], why: str
) -> None:
    folder = write(tmp_path, gpu_step(**kw))
    args = ["--bucket-cap-mb", "1", "--interconnect", "nvlink3"]
    assert main(["estimate", "--trace", str(folder), *args]) == 2
    assert why in capsys.readouterr().err


def test_bucket_sizes_that_disagree_with_their_all_reduce_are_refused(tmp_path: Path) -> None:
    trace = gpu_step()
    for e in trace["traceEvents"]:
        if e["name"] == NCCL:
            e["args"]["In msg nelems"] = 3 * GRAD_NUMEL
    (step,) = read_timelines(write(tmp_path, trace), gradients=True)
    with pytest.raises(ValueError, match="do not line up as DDP's buckets"):
        own_buckets(step)


def test_buckets_no_cap_gives_are_refused(tmp_path: Path) -> None:
    step = step_of(tmp_path)
    g = step.gradients
    assert g is not None
    # middle buckets [1, 0.25] MiB (closes only at a cap > 1 MiB) and [0.25] (only at <= 0.25)
    sizes = np.array([MIB // 4, MIB, MIB // 4, MIB // 4, MIB // 4], np.int64)
    members = (np.array([0]), np.array([1, 2]), np.array([3]), np.array([4]))
    own = OwnBuckets(
        members=members, collective=np.zeros(4, np.intp),
        num_bytes=np.array([int(sizes[m].sum()) for m in members], np.int64),
        ready_ns=np.zeros(4, np.int64),
    )  # fmt: skip
    wide = dataclasses.replace(step, gradients=dataclasses.replace(g, num_bytes=sizes))
    with pytest.raises(ValueError, match="follow DDP's rule for no cap"):
        own_cap_range(wide, own)


def test_real_gloo_trace_recorded_at_a_quarter_mib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tests/data/golden_gloo2: two gloo ranks of DDP at bucket_cap_mb=0.25 (make_golden.py)
    for f in GOLDEN.glob("rank*.json.gz"):
        shutil.copy(f, tmp_path / f.name)
    assert main(["estimate", "--trace", str(tmp_path), "--bucket-cap-mb", "25", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    low, high = doc["bucket_cap"]["own_cap_range_mb"]
    assert low < 0.25 <= high  # the cap it was recorded with is among those DDP's rule allows
    assert {r["own_buckets"] for r in doc["steps"]} == {3}
    assert {r["whatif_buckets"] for r in doc["steps"]} == {1}
    assert abs(doc["bucket_cap"]["own_layout_step_diff_pct"]) < 5.0
    assert abs(doc["bucket_cap"]["own_layout_exposed_diff_pct"]) < 5.0
    assert "fitted on the trace's own" in doc["bucket_cap"]["cost"]
    # DDP's default asked by name: its first bucket closes at 1 MiB (an explicit 25 MiB has
    # no such first bucket), so two buckets where 25 MiB made one; leaving the flag out asks
    # for no new cap
    assert main(["estimate", "--trace", str(tmp_path), "--bucket-cap-mb", "default", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["bucket_cap"]["bucket_cap_mb"] is None
    assert {r["whatif_buckets"] for r in default["steps"]} == {2}
    assert main(["estimate", "--trace", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out).get("bucket_cap") is None


@needs(REALTRACES)
def test_real_dlrm_trace_lays_out_a_new_cap() -> None:
    # PARAM's DLRM: 8 V100 ranks, one step each, three buckets of its dense layers
    timelines = read_timelines(REALTRACES / "param_dlrm_8rank", gradients=True)
    assert len(timelines) == 8
    for t in timelines:
        own = own_buckets(t)
        assert own.num_bytes.tolist() == [1_576_964, 754_112, 154_176]  # its dense MLPs
        low, high = own_cap_range(t, own)
        assert 0.7187 < low < high < 0.7192  # two DDP modules whose buckets fit one cap
        mine = replay(t, None, own_layout(t, own, 0, Layout))
        assert mine.step_ns <= t.measured_step_ns  # launched no later than they were
