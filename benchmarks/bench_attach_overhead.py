"""Benchmark: what ``commprof.attach`` costs the user's training step, beside the timing hook.

The method of ``bench_hook_overhead.py`` (two gloo ranks, spawned here, one intra-op thread
each; several DDP instances of one architecture and initial weights in the SAME processes and
process group; rounds interleaved with the order rotating so that no arm is always first; a
barrier before every step, untimed; a step's time is the max over ranks), with four arms:

- A: DDP with ``default_hooks.allreduce_hook`` registered directly (the user's step without
  commprof);
- B: the timing wrapper alone (``register_timing_hook``), the arm whose ratio
  ``benchmarks/results/hook_overhead.json`` reports; its ``resolve()`` runs after the timed
  window, as there;
- D: the whole ``commprof.attach`` session: the timing wrapper, the forward hooks and
  ``session.step()`` (which resolves the step's bucket rows) inside the timed window, since
  that is what the user's loop pays;
- C: a second plain instance like A: the noise floor.

Ratios of medians against A with bootstrap 95 % intervals (rounds resampled together), and of
the 10th percentiles. The session's end (gather and commit, into a temporary folder) runs after
the timed rounds and is reported apart.

Usage::

    python benchmarks/bench_attach_overhead.py            # about 2 min on 2 busy cores
    python benchmarks/bench_attach_overhead.py --smoke    # seconds, small model
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import ledger  # noqa: E402
from bench_env import environment  # noqa: E402
from bench_hook_overhead import (  # noqa: E402
    PG_TIMEOUT,
    SGD_LR,
    SGD_MOMENTUM,
    WARMUP_ROUNDS,
    _bootstrap_ratio,
    _build,
    _keep_going,
    _max_over_ranks,
    _stats,
    _timed_step,
)

from commprof.profiling.comm_hooks import register_timing_hook  # noqa: E402
from commprof.training.data import loss_fn, make_batch  # noqa: E402
from commprof.training.launcher import process_group, spawn_ranks  # noqa: E402
from commprof.training.models import count_parameters  # noqa: E402
from commprof.training.session import attach  # noqa: E402

DEFAULT_OUT = HERE / "results" / "attach_overhead.json"
WORLD_SIZE = 2
ARMS = "ABDC"
"""Plain, timing hook, attach session, control: rotated every round."""


def _worker(rank: int, world_size: int, store_path: str, args: argparse.Namespace) -> Any:
    store = dist.FileStore(store_path, world_size)
    with process_group(
        backend="gloo",
        rank=rank,
        world_size=world_size,
        store=store,
        timeout_s=PG_TIMEOUT.total_seconds(),
    ):
        return _run(rank, args)


def _run(rank: int, args: argparse.Namespace) -> dict[str, Any]:
    start_s = time.monotonic()
    criterion = loss_fn(args.model)
    batches = [make_batch(args.model, args.batch_size, rank=rank, seed=0, step=s) for s in range(4)]
    models = {arm: _build(args) for arm in ARMS}
    models["A"].register_comm_hook(None, default_hooks.allreduce_hook)
    models["C"].register_comm_hook(None, default_hooks.allreduce_hook)
    state = register_timing_hook(models["B"], inner="allreduce")
    optimizers = {
        arm: torch.optim.SGD(m.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)
        for arm, m in models.items()
    }
    out = Path(tempfile.mkdtemp(prefix="bench-attach-")) / "run"
    session = attach(models["D"], out, microbench_iters=0, max_steps=10**6)
    times: dict[str, list[int]] = {arm: [] for arm in ARMS}
    step_call_ns: list[int] = []
    i = 0
    with session:
        while i < WARMUP_ROUNDS + args.rounds and _keep_going(start_s, args.budget_s):
            order = ARMS[i % 4 :] + ARMS[: i % 4]
            batch = batches[i % len(batches)]
            for arm in order:
                if arm == "B":
                    state.step = i
                ns = _timed_step(models[arm], optimizers[arm], criterion, batch)
                if arm == "D":  # the user's loop calls step() inside its step: timed with it
                    t0 = time.perf_counter_ns()
                    session.step()
                    call_ns = time.perf_counter_ns() - t0
                    ns += call_ns
                    if i >= WARMUP_ROUNDS:
                        step_call_ns.append(call_ns)
                if arm == "B":
                    state.resolve()  # after the timed window, as in bench_hook_overhead
                if i >= WARMUP_ROUNDS:
                    times[arm].append(ns)
            i += 1
        end_started = time.perf_counter_ns()
    end_ns = time.perf_counter_ns() - end_started
    shutil.rmtree(out.parent, ignore_errors=True)
    gathered: list[Any] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, {**times, "step_call": step_call_ns})
    return {"per_rank": gathered, "end_ns": end_ns, "wall_s": time.monotonic() - start_s}


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Step times per arm (ms) and their ratios to the plain arm."""
    rng = np.random.default_rng(0)
    per_rank = raw["per_rank"]
    ms = {arm: _max_over_ranks(per_rank, arm) / 1e6 for arm in ARMS}
    plain = ms["A"]
    arms: dict[str, Any] = {}
    for arm, name in (("B", "timing_hook"), ("D", "attach"), ("C", "control")):
        arms[name] = {
            "step_ms": _stats(ms[arm].tolist()),
            "ratio_of_medians": float(np.median(ms[arm]) / np.median(plain)),
            "ratio_of_medians_ci95": _bootstrap_ratio(ms[arm], plain, paired=True, rng=rng),
            "ratio_of_p10": float(np.percentile(ms[arm], 10) / np.percentile(plain, 10)),
        }
    calls_ms = np.asarray(per_rank[0]["step_call"], dtype=np.float64) / 1e6
    arms["attach"]["step_call_ms"] = _stats(calls_ms.tolist())
    # session.step() timed directly, over the plain median step: a figure load cannot blur
    arms["attach"]["step_call_share"] = float(np.median(calls_ms) / np.median(plain))
    return {
        "benchmark": "attach_overhead",
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
            "threads_per_rank": 1,
        },
        "environment": environment("end"),
        "wall_s": raw["wall_s"],
        "plain_step_ms": _stats(plain.tolist()),
        **arms,
        "session_end_ms": raw["end_ns"] / 1e6,
        "raw_step_ns": _raw(per_rank),
    }


def _raw(per_rank: list[dict[str, list[int]]]) -> dict[str, list[list[int]]]:
    """Every rank's step times per arm, for the record."""
    return {arm: [r[arm] for r in per_rank] for arm in (*ARMS, "step_call")}


def print_table(report: dict[str, Any]) -> None:
    print(f"{report['config']['model']}, 2 gloo ranks")
    plain = report["plain_step_ms"]
    print(f"{'plain allreduce_hook':<22} median {plain['median']:8.2f} ms, IQR {plain['iqr']:.2f}")
    for name in ("timing_hook", "attach", "control"):
        arm = report[name]
        lo, hi = arm["ratio_of_medians_ci95"]
        print(
            f"{name:<22} median {arm['step_ms']['median']:8.2f} ms, ratio "
            f"{arm['ratio_of_medians']:.4f} [95% CI {lo:.4f}, {hi:.4f}], "
            f"p10 ratio {arm['ratio_of_p10']:.4f}"
        )
    call = report["attach"]["step_call_ms"]["median"] * 1e3
    share = report["attach"]["step_call_share"]
    print(f"session.step() timed alone: median {call:.1f} us = {share:.5f} of a plain step")
    print(f"session end (gather, commit): {report['session_end_ms']:.0f} ms, outside the steps")


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: each arm's median step over the plain hook's with its 95 %
    interval, ``session.step()`` alone as a share of the plain step, the load average."""
    arms = []
    for name, label in (("attach", "attach"), ("timing_hook", "wrapper"), ("control", "control")):
        lo, hi = report[name]["ratio_of_medians_ci95"]
        arms.append(f"{label} / plain {report[name]['ratio_of_medians']:.3f} [{lo:.3f}, {hi:.3f}]")
    call_us = report["attach"]["step_call_ms"]["median"] * 1e3
    share = 100 * report["attach"]["step_call_share"]
    load = report["environment"]["load_avg_1m_at_end"]
    return (
        f"{'; '.join(arms)}; session.step() {call_us:.0f} us = {share:.2f} % of the step; "
        f"load {load:.1f} at end"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="srn-10m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="None: DDP default")
    parser.add_argument("--rounds", type=int, default=150, help="timed rounds")
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--smoke", action="store_true", help="srn-1m, few rounds")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.rounds = "srn-1m", 6
    raw = spawn_ranks(_worker, WORLD_SIZE, args=(args,), limit_s=args.budget_s + 300)[0]
    report = summarize(raw, args)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    ledger.print_row(
        "attach_overhead", change=args.change, figures=headline(report), files=[args.out]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
