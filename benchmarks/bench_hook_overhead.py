"""Benchmark: what the timing hook and the profiler harness cost a DDP training step.

Two ranks (gloo, spawned on this machine, one intra-op thread each) train the same model in
several ways inside the SAME processes and process group, interleaved so that machine noise
(other users, frequency changes) hits every arm alike:

1. Hook overhead. Five DDP instances of one architecture and initial weights: A with
   ``default_hooks.allreduce_hook`` registered directly, B with commprof's timing wrapper
   around that same hook (``register_timing_hook(..., inner="allreduce")``), and C, a second
   plain instance like A: the control, whose ratio to A is the noise floor of the method
   (instance placement, order, load). Beside them D, DDP's built-in all-reduce (no comm hook:
   what a user's training runs without commprof), and E, the wrapper in its first form: around
   ``allreduce_hook`` as it is, two Python callbacks a bucket (``allreduce_hook``'s unwrap and
   the wrapper's clock) where B has one (``comm_hooks.allreduce_unwrapped``). DDP accepts one
   comm hook per instance, hence separate instances. Rounds run A to E with the order rotating
   (ABCDE, BCDEA, ...) so that no arm is always first. Ratio = median(B) / median(A); control
   = median(C) / median(A); beside them B / D, A / D and B / E. ``--model srn-100k
   --bucket-cap-mb 0.05`` is the latency-bound case (five buckets of about 80 KiB), where a
   Python callback's cost shows.
2. Profiler overhead. Model B alternates blocks of steps outside any profiler with blocks
   inside an active ``torch.profiler`` (commprof.profiling.harness, one warm-up step that is
   not counted, then ``--block`` recorded steps, exported as .json.gz when the block ends).
   Ratio = median(recorded) / median(plain). Export time is reported apart: it happens after
   the block, outside every timed step.
3. Wrapper cost timed directly (:func:`wrapper_cost_ns`): the host time the wrapper adds per
   bucket, without DDP or transfers; times buckets per step over the plain median step gives
   the overhead ratio it implies, a figure the machine's noise cannot blur.

Step time is host ``perf_counter_ns`` around forward, backward (DDP's all-reduces included:
``backward()`` returns after they completed) and the optimizer step, as in
``commprof.training.trainer``; ``TimingState.resolve()`` runs after the timed window, as there,
and its own time is reported. A barrier before every step (untimed) starts both ranks together;
a step's time is the max over ranks. Spread: interquartile range (IQR, p25 to p75) of each
arm's step times, of the paired per-step ratios B/A, and a bootstrap 95 % interval of the
ratio of medians (rounds resampled together for the hook, steps independently otherwise).
The ratio of the 10th percentiles is given too: load spikes from other users only ever add
time, so the low quantiles are the least disturbed.

Usage::

    python benchmarks/bench_hook_overhead.py                 # ~3 min on 2 busy cores
    python benchmarks/bench_hook_overhead.py --smoke         # seconds, small model
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import ledger  # noqa: E402
from bench_env import environment  # noqa: E402

from commprof.profiling.comm_hooks import (  # noqa: E402
    COMPOSITION_STEP,
    TimingState,
    register_timing_hook,
    timing_wrapper,
)
from commprof.profiling.harness import profiled  # noqa: E402
from commprof.training.data import loss_fn, make_batch  # noqa: E402
from commprof.training.launcher import process_group, spawn_ranks  # noqa: E402
from commprof.training.models import build_model, count_parameters  # noqa: E402

DEFAULT_OUT = HERE / "results" / "hook_overhead.json"
WORLD_SIZE = 2
WARMUP_ROUNDS = 3
"""Untimed rounds first: step 0 (one bucket, then DDP's rebuild), allocator, caches."""
GOAL_RATIO = 1.01
"""The bar for the timing hook: median step time with it / without it."""
BOOTSTRAP_ROUNDS = 2000
PG_TIMEOUT = datetime.timedelta(seconds=300)
SGD_LR = 0.01
SGD_MOMENTUM = 0.9
ARM_NAMES = {"A": "plain", "B": "timed", "C": "control", "D": "builtin", "E": "two_callbacks"}
"""Phase 1's arms by letter: their step times are ``<name>_ns`` in the raw records."""
ARMS = "".join(ARM_NAMES)


def _allreduce_as_is(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``allreduce_hook`` behind another name: the wrapper runs it as it is (arm E)."""
    return default_hooks.allreduce_hook(process_group, bucket)


def _timed_step(
    ddp: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    criterion: Any,
    batch: tuple[torch.Tensor, torch.Tensor],
) -> int:
    dist.barrier()  # sync point: both ranks start the step together (untimed)
    inputs, targets = batch
    t0 = time.perf_counter_ns()
    loss = criterion(ddp(inputs), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter_ns() - t0


def _keep_going(start_s: float, budget_s: float) -> bool:
    """Rank 0 decides whether the wall budget allows another round; every rank follows."""
    flag = torch.tensor([1 if time.monotonic() - start_s < budget_s else 0])
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _worker(rank: int, world_size: int, store_path: str, args: argparse.Namespace) -> Any:
    store = dist.FileStore(store_path, world_size)
    timeout_s = PG_TIMEOUT.total_seconds()
    with process_group(
        backend="gloo", rank=rank, world_size=world_size, store=store, timeout_s=timeout_s
    ):
        return _run(rank, args)


def _build(args: argparse.Namespace) -> DistributedDataParallel:
    torch.manual_seed(0)  # both arms start from the same weights
    return DistributedDataParallel(build_model(args.model), bucket_cap_mb=args.bucket_cap_mb)


def _run(rank: int, args: argparse.Namespace) -> dict[str, Any]:
    start_s = time.monotonic()
    criterion = loss_fn(args.model)
    batches = [make_batch(args.model, args.batch_size, rank=rank, seed=0, step=s) for s in range(4)]
    plain = _build(args)
    plain.register_comm_hook(None, default_hooks.allreduce_hook)
    timed = _build(args)
    state = register_timing_hook(timed, inner="allreduce")
    control = _build(args)  # a second plain instance: the A/A noise floor
    control.register_comm_hook(None, default_hooks.allreduce_hook)
    builtin = _build(args)  # no comm hook: DDP's built-in all-reduce
    two = _build(args)  # the wrapper around allreduce_hook as it is: two callbacks a bucket
    two_state = TimingState(None)
    two.register_comm_hook(two_state, timing_wrapper(_allreduce_as_is))
    opt_timed = torch.optim.SGD(timed.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)
    others = {
        arm: (model, torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM))
        for arm, model in (("A", plain), ("C", control), ("D", builtin), ("E", two))
    }

    buckets_seen: list[int] = []

    def step_timed(i: int) -> tuple[int, int]:
        state.step = i
        ns = _timed_step(timed, opt_timed, criterion, batches[i % len(batches)])
        t0 = time.perf_counter_ns()
        rows = state.resolve()  # after the timed window, as the trainer does
        resolve_ns = time.perf_counter_ns() - t0
        buckets_seen.append(len(rows))
        return ns, resolve_ns

    # Phase 1: interleaved rounds of A to E (plain, timed, control, built-in, two callbacks),
    # the order rotating every round so that no arm always runs first or after one neighbour.
    times: dict[str, list[int]] = {arm: [] for arm in ARMS}
    resolve_ns: list[int] = []
    i = 0
    while i < WARMUP_ROUNDS + args.rounds and _keep_going(start_s, args.hook_budget_s):
        order = ARMS[i % len(ARMS) :] + ARMS[: i % len(ARMS)]
        measured = i >= WARMUP_ROUNDS
        for arm in order:
            batch = batches[i % len(batches)]
            if arm == "B":
                ns, res_ns = step_timed(i)
                if measured:
                    resolve_ns.append(res_ns)
            else:
                two_state.step = i  # before the step, as for B
                ns = _timed_step(*others[arm], criterion, batch)
                if arm == "E":
                    two_state.resolve()  # after the timed window, as for B
            if measured:
                times[arm].append(ns)
        i += 1
    num_buckets = buckets_seen[-1]

    # Phase 2: blocks outside / inside an active profiler, alternating, on the timed model.
    off_ns: list[int] = []
    on_ns: list[int] = []
    export_ns: list[int] = []
    trace_bytes: list[int] = []
    trace_dir = Path(tempfile.mkdtemp(prefix=f"bench-traces-r{rank}-"))
    block = 0
    while block < 2 * args.blocks and _keep_going(start_s, args.total_budget_s):
        profile_this = block % 4 in (0, 3)  # on, off, off, on, on, off, ...: ABBA order
        if not profile_this:
            for _ in range(args.block):
                i += 1
                off_ns.append(step_timed(i)[0])
        else:
            out = trace_dir / f"block{block}"
            with profiled(out, rank=rank, wait=0, warmup=1, active=args.block, repeat=1) as prof:
                for k in range(1 + args.block):
                    i += 1
                    ns = step_timed(i)[0]
                    if k >= 1:  # the profiler's warm-up step is not counted
                        on_ns.append(ns)
                    if k < args.block:
                        prof.step()
                t0 = time.perf_counter_ns()
                prof.step()  # ends the active range: the trace is exported here
            export_ns.append(time.perf_counter_ns() - t0)
            trace_bytes.extend(p.stat().st_size for p in out.glob("*.json.gz"))
        block += 1

    shutil.rmtree(trace_dir, ignore_errors=True)
    local = {
        **{f"{name}_ns": times[arm] for arm, name in ARM_NAMES.items()},
        "resolve_ns": resolve_ns,
        "off_ns": off_ns,
        "on_ns": on_ns,
        "export_ns": export_ns,
        "trace_bytes": trace_bytes,
    }
    gathered: list[Any] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, local)
    return {
        "per_rank": gathered,
        "num_buckets": num_buckets,
        "profiler_impl": "commprof.profiling.harness.profiled",
        "wall_s": time.monotonic() - start_s,
    }


class _FakeBucket:
    """Duck-typed ``dist.GradBucket``: the three methods the timing wrapper calls."""

    def __init__(self, index: int, buffer: torch.Tensor, params: list[torch.Tensor]) -> None:
        self._index, self._buffer, self._params = index, buffer, params

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return self._params


def _completed_hook(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def wrapper_cost_ns(num_calls: int = 20_000, repeats: int = 7) -> dict[str, float]:
    """Host cost the timing wrapper adds per bucket, timed directly (no DDP, no transfer).

    The inner hook returns an already completed future, so the wrapper's ``then`` callback
    runs inline and is included. Median over ``repeats`` of (wrapped - bare) per call, with
    a steady-state step (after the composition step). A real ``GradBucket`` builds a tensor
    for ``buffer()`` on each call, which the fake does not: a slight underestimate.
    """
    buffer = torch.zeros(1024)
    bucket = _FakeBucket(0, buffer, [buffer])
    state = TimingState(None)
    state.step = COMPOSITION_STEP + 1
    hook = timing_wrapper(_completed_hook)
    diffs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(num_calls):
            _completed_hook(None, bucket)
        bare = time.perf_counter_ns() - t0
        t0 = time.perf_counter_ns()
        for _ in range(num_calls):
            hook(state, bucket)  # type: ignore[arg-type]
        wrapped = time.perf_counter_ns() - t0
        state.raw.clear()
        diffs.append((wrapped - bare) / num_calls)
    return {"per_bucket_ns": statistics.median(diffs), "min_ns": min(diffs), "max_ns": max(diffs)}


def _stats(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    p25, p50, p75 = np.percentile(arr, [25, 50, 75])
    return {
        "n": len(values),
        "median": float(p50),
        "p25": float(p25),
        "p75": float(p75),
        "iqr": float(p75 - p25),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def _bootstrap_ratio(
    num: np.ndarray, den: np.ndarray, *, paired: bool, rng: np.random.Generator
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(num) / median(den)."""
    ratios = np.empty(BOOTSTRAP_ROUNDS)
    for b in range(BOOTSTRAP_ROUNDS):
        i = rng.integers(0, len(num), len(num))
        j = i if paired else rng.integers(0, len(den), len(den))
        ratios[b] = np.median(num[i]) / np.median(den[j])
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def _max_over_ranks(per_rank: list[dict[str, list[int]]], key: str) -> np.ndarray:
    n = min(len(r[key]) for r in per_rank)
    return np.max(np.array([r[key][:n] for r in per_rank], dtype=np.float64), axis=0)


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Turn the ranks' step times into the report (times in ms, ratios unitless)."""
    rng = np.random.default_rng(0)
    per_rank = raw["per_rank"]
    a = _max_over_ranks(per_rank, "plain_ns") / 1e6
    b = _max_over_ranks(per_rank, "timed_ns") / 1e6
    c = _max_over_ranks(per_rank, "control_ns") / 1e6
    d = _max_over_ranks(per_rank, "builtin_ns") / 1e6
    e = _max_over_ranks(per_rank, "two_callbacks_ns") / 1e6
    off = _max_over_ranks(per_rank, "off_ns") / 1e6
    on = _max_over_ranks(per_rank, "on_ns") / 1e6
    paired = b / a
    hook = {
        "plain_step_ms": _stats(a.tolist()),
        "timed_step_ms": _stats(b.tolist()),
        "ratio_of_medians": float(np.median(b) / np.median(a)),
        "ratio_of_medians_ci95": _bootstrap_ratio(b, a, paired=True, rng=rng),
        "paired_ratio": _stats(paired.tolist()),
        "control_step_ms": _stats(c.tolist()),
        "control_ratio_of_medians": float(np.median(c) / np.median(a)),
        "control_ratio_of_medians_ci95": _bootstrap_ratio(c, a, paired=True, rng=rng),
        "builtin_step_ms": _stats(d.tolist()),
        "two_callbacks_step_ms": _stats(e.tolist()),
        "over_builtin": {
            name: {
                "ratio_of_medians": float(np.median(x) / np.median(d)),
                "ratio_of_medians_ci95": _bootstrap_ratio(x, d, paired=True, rng=rng),
            }
            for name, x in (("timed", b), ("plain", a))
        },
        "timed_over_two_callbacks": float(np.median(b) / np.median(e)),
        "timed_over_two_callbacks_ci95": _bootstrap_ratio(b, e, paired=True, rng=rng),
        "ratio_of_p10": float(np.percentile(b, 10) / np.percentile(a, 10)),
        "control_ratio_of_p10": float(np.percentile(c, 10) / np.percentile(a, 10)),
        "resolve_ms": _stats([x / 1e6 for x in per_rank[0]["resolve_ns"]]),
        "buckets_per_step": raw["num_buckets"],
        "goal_ratio": GOAL_RATIO,
        "meets_goal": bool(np.median(b) / np.median(a) <= GOAL_RATIO),
    }
    profiler: dict[str, Any] = {"implementation": raw["profiler_impl"]}
    if len(on) and len(off):
        profiler.update(
            off_step_ms=_stats(off.tolist()),
            recorded_step_ms=_stats(on.tolist()),
            ratio_of_medians=float(np.median(on) / np.median(off)),
            ratio_of_medians_ci95=_bootstrap_ratio(on, off, paired=False, rng=rng),
            export_ms=_stats([x / 1e6 for x in per_rank[0]["export_ns"]]),
            trace_kib=_stats([x / 1024 for x in per_rank[0]["trace_bytes"]]),
        )
    return {
        "benchmark": "hook_overhead",
        "config": {
            "model": args.model,
            "num_parameters": count_parameters(args.model),
            "world_size": WORLD_SIZE,
            "backend": "gloo",
            "device": "cpu",
            "batch_size": args.batch_size,
            "bucket_cap_mb": args.bucket_cap_mb,
            "rounds_requested": args.rounds,
            "warmup_rounds": WARMUP_ROUNDS,
            "block_steps": args.block,
            "blocks_requested_per_arm": args.blocks,
            "threads_per_rank": 1,
        },
        "environment": environment("end"),
        "wall_s": raw["wall_s"],
        "hook": hook,
        "profiler": profiler,
    }


def _fmt(s: dict[str, float]) -> str:
    return f"{s['median']:9.2f} {s['p25']:9.2f} {s['p75']:9.2f} {s['iqr']:8.2f} {s['n']:4d}"


def print_table(report: dict[str, Any]) -> None:
    hook, prof = report["hook"], report["profiler"]
    print(f"{report['config']['model']}, 2 gloo ranks, {hook['buckets_per_step']} buckets/step")
    print(f"{'arm':<24} {'median ms':>9} {'p25':>9} {'p75':>9} {'IQR':>8} {'n':>4}")
    print(f"{'plain allreduce_hook':<24} {_fmt(hook['plain_step_ms'])}")
    print(f"{'timing hook':<24} {_fmt(hook['timed_step_ms'])}")
    print(f"{'plain again (control)':<24} {_fmt(hook['control_step_ms'])}")
    print(f"{'built-in (no hook)':<24} {_fmt(hook['builtin_step_ms'])}")
    print(f"{'timing hook, 2 callbacks':<24} {_fmt(hook['two_callbacks_step_ms'])}")
    lo, hi = hook["ratio_of_medians_ci95"]
    pr = hook["paired_ratio"]
    print(
        f"hook ratio (timed/plain): {hook['ratio_of_medians']:.4f} "
        f"[95% CI {lo:.4f}, {hi:.4f}]; paired ratios median {pr['median']:.4f}, "
        f"IQR {pr['p25']:.4f}-{pr['p75']:.4f}; goal <= {GOAL_RATIO}: "
        f"{'met' if hook['meets_goal'] else 'NOT met'}"
    )
    lo, hi = hook["control_ratio_of_medians_ci95"]
    print(
        f"control ratio (plain again/plain, the noise floor): "
        f"{hook['control_ratio_of_medians']:.4f} [95% CI {lo:.4f}, {hi:.4f}]"
    )
    print(
        f"p10 ratios (less sensitive to load spikes): hook {hook['ratio_of_p10']:.4f}, "
        f"control {hook['control_ratio_of_p10']:.4f}"
    )
    for name, label in (("timed", "timing hook"), ("plain", "plain allreduce_hook")):
        over = hook["over_builtin"][name]
        lo, hi = over["ratio_of_medians_ci95"]
        print(f"{label} / built-in: {over['ratio_of_medians']:.4f} [95% CI {lo:.4f}, {hi:.4f}]")
    lo, hi = hook["timed_over_two_callbacks_ci95"]
    print(
        f"timing hook / its two-callback form: {hook['timed_over_two_callbacks']:.4f} "
        f"[95% CI {lo:.4f}, {hi:.4f}]"
    )
    if "wrapper_cost" in hook:
        w = hook["wrapper_cost"]
        print(
            f"wrapper cost timed directly: {w['per_bucket_ns'] / 1e3:.1f} us/bucket, "
            f"{w['per_step_ns'] / 1e3:.1f} us/step -> implied ratio {w['implied_ratio']:.5f}"
        )
    print(f"resolve() per step: median {hook['resolve_ms']['median'] * 1e3:.1f} us (untimed)")
    if "recorded_step_ms" in prof:
        print(f"{'no profiler':<24} {_fmt(prof['off_step_ms'])}")
        print(f"{'profiler recording':<24} {_fmt(prof['recorded_step_ms'])}")
        lo, hi = prof["ratio_of_medians_ci95"]
        print(
            f"profiler ratio (recorded/off): {prof['ratio_of_medians']:.4f} "
            f"[95% CI {lo:.4f}, {hi:.4f}] via {prof['implementation']}; export per block "
            f"{prof['export_ms']['median']:.0f} ms, trace {prof['trace_kib']['median']:.0f} KiB"
        )
    print(f"wall {report['wall_s']:.0f} s in the ranks")


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: timed / plain median step with its 95 % interval, the control's
    ratio, timed and plain over the built-in all-reduce, timed over its two-callback form, the
    wrapper's own cost per bucket, profiler on / off, the load average."""
    hook, prof = report["hook"], report["profiler"]
    lo, hi = hook["ratio_of_medians_ci95"]
    over = hook["over_builtin"]
    return (
        f"{report['config']['model']} at {report['config']['bucket_cap_mb'] or 'default'} MiB, "
        f"{hook['buckets_per_step']} buckets: wrapper / plain {hook['ratio_of_medians']:.3f} "
        f"[{lo:.3f}, {hi:.3f}], control {hook['control_ratio_of_medians']:.3f}; over built-in: "
        f"wrapper {over['timed']['ratio_of_medians']:.3f}, plain "
        f"{over['plain']['ratio_of_medians']:.3f}; wrapper / two-callback form "
        f"{hook['timed_over_two_callbacks']:.3f}; wrapper "
        f"{hook['wrapper_cost']['per_bucket_ns'] / 1e3:.1f} us a bucket; profiler on / off "
        f"{prof['ratio_of_medians']:.3f}; load {report['environment']['load_avg_1m_at_end']:.1f} "
        "at end"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="srn-10m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="None: DDP default")
    parser.add_argument("--rounds", type=int, default=150, help="timed rounds (hook phase)")
    parser.add_argument("--block", type=int, default=5, help="steps per profiler block")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per arm (profiler phase)")
    parser.add_argument("--hook-budget-s", type=float, default=110.0)
    parser.add_argument("--total-budget-s", type=float, default=185.0)
    parser.add_argument("--smoke", action="store_true", help="srn-1m, few steps")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.rounds, args.blocks, args.block = "srn-1m", 6, 2, 2
    raw = spawn_ranks(_worker, WORLD_SIZE, args=(args,), limit_s=args.total_budget_s + 300)[0]
    report = summarize(raw, args)
    cost = wrapper_cost_ns()
    per_step_ns = cost["per_bucket_ns"] * report["hook"]["buckets_per_step"]
    report["hook"]["wrapper_cost"] = {
        **cost,
        "per_step_ns": per_step_ns,
        "implied_ratio": 1 + per_step_ns / (report["hook"]["plain_step_ms"]["median"] * 1e6),
    }
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    ledger.print_row(
        "hook_overhead", change=args.change, figures=headline(report), files=[args.out]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
