"""Does the step simulator predict training out of sample? Side by side with simpler models.

Collection (one run, this machine: gloo over loopback, ranks spawned locally, no Ray): the cells
declared in ``step_model_split.yaml`` (``step_model_split.load_split``): per model its
calibration cap and held-out caps at the split's world size (p = 2; srn-100k, srn-1m, srn-10m
and resnet18) and its held-out world sizes (srn-1m at p = 3, srn-10m at p = 4), in interleaved
rounds (every cell once per round, the order shuffled per round with a fixed seed) so that load
drifts hit every cap alike; a round's cells of one world size share one gang of rank processes
(one process group for all), as a sweep's reused gangs do. Every round's calibration cell of
each model runs with the defaults of ``commprof run`` (microbenchmark and interference arms);
the others with a minimal microbenchmark. Each cell records the host's load average when it
ended (``cells.load_avg_1m``). The raw dataset is kept compressed (``--archive``:
``results/step_model_data.tar.gz``); ``collection.json`` in it records the split file's
SHA-256.

The split is fixed before the run, in the committed YAML file (the analysis reads the same
file, ``step_model_analysis.py``):

* Calibration: per model, its calibration cells (25 MiB, DDP's default size set explicitly, at
  p = 2; every round's pooled, the headline; round 0's alone beside it): their timeline and the
  ring fit of their microbenchmarks; the interference factors from every p = 2 calibration cell
  of the host. Nothing else.
* Validation: every held-out cap of the model at p = 2 (median over rounds of the measured step
  time and of the per-step exposed communication, both from the timing hook's own records);
  and each held-out world size, predicted from the p = 2 calibration. Cells never used before
  the split was declared: srn-100k (latency-bound: 0.38 MiB of gradients) at 0.05, 0.1, 0.25 and
  25 MiB, and srn-1m at p = 3.

Models compared (all from the same calibration): ``simulator`` (step_sim with interference, the
stall, the hook split and the two residuals that make it reproduce its calibration cells, in
sample only, ``step_advice``),
``simulator_median`` (calibrated with median interference factors in place of means), ``idle_ring``
(the same timeline and fit, no interference, one channel: ``commprof estimate``'s model),
``bucket_sum`` (compute plus the sum of the buckets' in-training times from the ``buckets`` fit of
the calibration cell, no overlap), ``no_overlap`` (compute plus the sum of idle all-reduce times).
Error: step time APE, and |predicted - measured exposed| / measured step. Ablation
(``step_model_ablation.ablation``): the simulator with each correction off in turn (the host
stall, mean interference factors, interference, the hook split; the two residuals apply in
sample only and move no held-out cell but one of the calibration's own buckets, srn-1m at 4
MiB), on the same held-out cells.

Goals (issue #28), per model and in one run: held-out step MAPE <= 10 %, and the advice within
3 % of the best measured cap. The cap the simulator recommends among the model's caps
(calibration only) against the best measured cap, read on step-interleaved pairs: each round
also trains each model's caps side by side in one gang, step by step in a shuffled order
(``_pairs_gang``, the split's ``pair_steps`` cycles), so that the host's drift, which moves
whole cells by 6 to 7 % on this host, hits every cap alike; the goal's figure is the
recommended cap's median over all the run's interleaved steps over the best cap's, the rounds'
hits beside it. Reported beside it, on the cells: ``pairs`` (the two caps' cells of each
round), ``round_best`` (against the shortest of the round's cells) and ``same_layout`` (two caps
that DDP buckets identically count as one configuration).

Usage: ``python benchmarks/bench_step_model.py [--rounds 4] [--budget-s 1200]`` writes
``benchmarks/results/step_model.json`` and ``benchmarks/results/step_model_data.tar.gz``;
``--analyze-only`` recomputes the report from that archive (or from a folder, ``--data``) under
the committed split (a cell the dataset lacks: ``not collected``); ``--smoke`` collects
srn-100k and srn-1m only (one round, an eighth of the pairs' cycles) outside ``results/``.
``--split step_model_unseen.yaml`` runs the configurations the committed split does not contain
(its result, archive and ledger rows: ``step_model_unseen``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ledger  # noqa: E402
import torch  # noqa: E402
from bench_env import environment  # noqa: E402
from step_model_ablation import ablation_table, pooled_table, pooled_verdict  # noqa: E402
from step_model_analysis import PAIRS_FILE, analyze, split_sha256  # noqa: E402
from step_model_split import SPLIT_FILE, Split, load_split  # noqa: E402

from commprof import results  # noqa: E402
from commprof.matrix import Cell  # noqa: E402
from commprof.outcomes import merge_rank_records  # noqa: E402
from commprof.training.launcher import spawn_ranks  # noqa: E402

STEPS, WARMUP = 22, 2
"""Steps 2 to 21 measured (step 0 never is): 20 a cell; with 4, a cell's median moved by up to
30 % between rounds (a single step of srn-1m at 0.25 MiB took 10 to 30 ms)."""
SEED = 1
SMOKE_MODELS = ("srn-100k", "srn-1m")
"""``--smoke``: the smallest models, every cell of theirs (caps and world sizes); a split with
neither: its first model."""
SMOKE_PAIR_DIVISOR = 8
"""``--smoke`` runs this fraction of each model's ``pair_steps`` (the split's ``pair_steps``:
about 20 to 35 s of steps a model on this host, so that a cap's median over its steps moves by
1 to 2 % between rounds by the step noise measured on this host, median of n steps: 1.25 sigma /
sqrt(n))."""
ARCHIVE_ROOT = "step_model_data"
SCRATCH = Path(os.environ.get("TMPDIR", "/tmp")) / "commprof-bench" / ARCHIVE_ROOT
"""Where a collection writes the dataset before it is packed."""
MINIMAL_MICROBENCH = {
    "microbench_sizes_bytes": (4096,),
    "microbench_iters": 1,
    "interference_iters": 0,
}
"""Validation cells: no interference arms, one tiny microbenchmark size (bucket sizes are still
measured once each): the model never reads them."""


def _cells(round_index: int, split: Split, models: Sequence[str]) -> list[Cell]:
    """A round's cells of ``models``: every cap of each at the split's world size (the
    calibration cap with the defaults of ``commprof run``, the others with a minimal
    microbenchmark), then each held-out world size."""
    cells = []
    for ms in (split.model(name) for name in models):
        common = dict(
            model=ms.name, batch_size=ms.batch_size, steps=STEPS, warmup_steps=WARMUP, seed=SEED,
            repeat=round_index,
        )  # fmt: skip
        for cap in ms.caps_mb:
            calibration = cap == ms.calibration_cap_mb
            extra: dict[str, Any] = {} if calibration else dict(MINIMAL_MICROBENCH)
            cells.append(
                Cell(world_size=split.world_size, bucket_cap_mb=cap, **common, **extra)  # type: ignore[arg-type]
            )
        for world in ms.held_out_worlds:
            cells.append(
                Cell(
                    world_size=world.world_size, bucket_cap_mb=world.bucket_cap_mb, **common,  # type: ignore[arg-type]
                    **MINIMAL_MICROBENCH,
                )
            )  # fmt: skip
    return cells


def _gang(rank: int, world_size: int, store_path: str, cells: list[Cell]) -> list[dict[str, Any]]:
    """One rank running several cells in one process group, as a reused Ray gang does."""
    import torch.distributed as dist

    from commprof.training.launcher import fingerprint, process_group
    from commprof.training.trainer import train_rank

    out = []
    device = torch.device("cpu")
    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        for cell in cells:
            out.append({**train_rank(cell, rank=rank, device=device), "env": fingerprint(device)})
    return out


def _pairs_gang(
    rank: int, world_size: int, store_path: str, round_index: int,
    plan: dict[str, tuple[tuple[float, ...], int, int]],
) -> dict[str, dict[str, list[int]]]:  # fmt: skip
    """One rank of a round's step-interleaved pairs: per model, its caps trained side by side.

    ``plan``: per model (caps, batch size, cycles). A DDP replica of the model per cap (the same
    initial weights, each with the timing hook and its own optimizer) in one process group; two
    warm-up steps each, then the model's cycles, each one step of every cap on the same batch, in
    an order shuffled every cycle (a seeded generator, the same on every rank; a rotation would
    keep each cap's neighbours). The
    steps are timed as a cell's (``trainer._timed_step``). Returns per model and cap the
    measured step times (ns).
    """
    import torch.distributed as dist

    from commprof.profiling.comm_hooks import register_timing_hook
    from commprof.training.data import loss_fn, make_batch
    from commprof.training.launcher import process_group
    from commprof.training.models import build_model
    from commprof.training.trainer import _optimizer, _timed_step

    device = torch.device("cpu")
    out: dict[str, dict[str, list[int]]] = {}
    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        for model, (caps, batch, cycles) in plan.items():
            arms = []
            for cap_mb in caps:
                cell = Cell(model=model, world_size=world_size, bucket_cap_mb=cap_mb, seed=SEED)
                torch.manual_seed(SEED)
                ddp = torch.nn.parallel.DistributedDataParallel(
                    build_model(model).to(device), bucket_cap_mb=cap_mb
                )
                state = register_timing_hook(ddp, inner=cell.hook)
                arms.append((str(cap_mb), ddp, state, _optimizer(cell, ddp.parameters())))
            criterion = loss_fn(model)
            times: dict[str, list[int]] = {cap: [] for cap, *_ in arms}
            order = random.Random(SEED + round_index)  # the same on every rank
            for step in range(WARMUP + cycles):
                inputs, targets = make_batch(
                    model, batch, rank=rank, seed=SEED + round_index, step=step,
                    device=device,
                )  # fmt: skip
                order.shuffle(arms)
                for cap, ddp, state, optimizer in arms:
                    state.step = step
                    t0, _, _, t3 = _timed_step(ddp, optimizer, criterion, inputs, targets, device)
                    state.resolve()
                    if step >= WARMUP:
                        times[cap].append(t3 - t0)
            out[model] = times
    return out


def _commit(data: Path, cells: list[Cell], per_rank: list[list[dict[str, Any]]]) -> None:
    for i, cell in enumerate(cells):
        ranks = [results_of_rank[i] for results_of_rank in per_rank]
        row = results.cell_row(
            cell, sweep="step-model", attempt=1, status="ok", env=ranks[0]["env"],
            load_avg_1m=ranks[0]["env"].get("load_avg_1m"),
        )  # fmt: skip
        results.write_attempt(data, row, merge_rank_records(ranks))


def collect(
    data: Path, rounds: int, budget_s: float, split: Split, models: Sequence[str],
    pair_divisor: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """Run the rounds into ``data``; stop starting rounds once ``budget_s`` is spent.

    Per round one gang of fresh processes per world size (the split's first, then each held-out
    one) runs that world size's cells of ``models`` in a shuffled order in one process group:
    process start (seconds a cell on a loaded host) is paid once a gang instead of once a cell.
    A last gang at the split's world size then runs the round's step-interleaved pairs
    (``_pairs_gang``, each model's ``pair_steps // pair_divisor`` cycles), kept in
    ``data / PAIRS_FILE`` as ``[{"round", "ranks": [{model: {cap: [ns]}}]}]``.
    """
    started = time.monotonic()
    done = 0
    orders = []
    pairs: list[dict[str, Any]] = []
    plan = {
        ms.name: (ms.caps_mb, ms.batch_size, max(1, ms.pair_steps // pair_divisor))
        for ms in (split.model(n) for n in models)
    }
    for r in range(rounds):
        if r > 0 and time.monotonic() - started > budget_s:
            break
        cells = _cells(r, split, models)
        random.Random(SEED + r).shuffle(cells)
        worlds = [split.world_size, *sorted({c.world_size for c in cells} - {split.world_size})]
        for world in worlds:
            group = [c for c in cells if c.world_size == world]
            per_rank = spawn_ranks(_gang, world, args=(group,), limit_s=1800)
            _commit(data, group, per_rank)
            orders.append([c.cell_id for c in group])
        per_rank_pairs = spawn_ranks(_pairs_gang, split.world_size, args=(r, plan), limit_s=1800)
        pairs.append({"round": r, "ranks": per_rank_pairs})
        (data / PAIRS_FILE).write_text(json.dumps(pairs) + "\n")
        done += 1
        print(f"round {r} done at {time.monotonic() - started:.0f} s", flush=True)
    return {
        "rounds_done": done, "collect_s": time.monotonic() - started, "orders": orders,
        "models": list(models), "pair_cycles": {m: p[2] for m, p in plan.items()},
    }  # fmt: skip


def pack(data: Path, archive: Path) -> None:
    """Write the dataset folder ``data`` to ``archive`` as a .tar.gz under ``ARCHIVE_ROOT``.

    Members are sorted, with no times, owners or modes of this machine, so the archive depends
    only on the files' names and bytes.
    """
    archive.parent.mkdir(parents=True, exist_ok=True)
    files = sorted(p for p in data.rglob("*") if p.is_file())
    with (
        archive.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in files:
            info = tarfile.TarInfo(f"{ARCHIVE_ROOT}/{path.relative_to(data).as_posix()}")
            info.size, info.mode = path.stat().st_size, 0o644
            with path.open("rb") as fh:
                tar.addfile(info, fh)


def unpack(archive: Path, into: Path) -> Path:
    """Extract ``archive`` (written by :func:`pack`) into ``into``; returns the dataset folder."""
    if not archive.is_file():
        raise ValueError(f"--archive {archive}: no such file; run the benchmark or pass --data")
    with tarfile.open(archive, "r:gz") as tar:
        stray = [n for n in tar.getnames() if not n.startswith(f"{ARCHIVE_ROOT}/")]
        if stray:
            raise ValueError(
                f"--archive {archive}: {stray[0]!r} is outside {ARCHIVE_ROOT}/; "
                "pass an archive written by this script"
            )
        tar.extractall(into, filter="data")
    return into / ARCHIVE_ROOT


def _report(data: Path, split_path: Path) -> dict[str, Any]:
    """The collection's metadata and the analysis of the dataset folder ``data`` under the split
    in ``split_path``."""
    meta = json.loads((data / "collection.json").read_text())
    report = {**meta, **analyze(data, split_path)}
    report.pop("orders", None)
    return report


def headline(report: dict[str, Any]) -> str:
    """The ledger's figures: per model (in the split's order) the simulator's held-out step
    MAPE, worst exposed error and advice ratio to the best cap (interleaved where the run has
    it), each held-out world size's step error, the goals met, the load average."""
    summary = report["summary"]
    names = list(summary["goals"])

    def figure(name: str, key: str) -> str:
        entry = summary[name]
        if not isinstance(entry, dict) or key not in entry:
            return "n/c"
        return f"{entry[key]['simulator']:.1f}"

    def ratio(name: str) -> str:
        entry = summary[name]
        value = entry["goals"]["advice_ratio_to_best"] if isinstance(entry, dict) else None
        return "n/c" if value is None else f"{value:.3f}"

    worlds = "; ".join(
        f"{k} {v if isinstance(v, str) else format(v['same_host'], '.1f') + ' %'}"
        for k, v in summary["world_sizes_step_ape_pct"].items()
    )
    met = sum(v == "meets both goals" for v in summary["goals"].values())
    env = report["environment"]
    step = " / ".join(figure(n, "held_out_step_mape_pct") for n in names)
    exposed = " / ".join(figure(n, "held_out_exposed_err_max_pct_of_step") for n in names)
    return (
        f"{' / '.join(names)}: step MAPE {step} %, worst exposed {exposed} % of the step, "
        f"advice / best {' / '.join(ratio(n) for n in names)} (interleaved); "
        f"{worlds}; goals met {met} of {len(names)}; load {env['load_avg_1m_at_start']:.1f} to "
        f"{env['load_avg_1m_at_end']:.1f}"
    )


THIS_RUN = "this run"
"""The label of the run being analysed in a pooled verdict."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pool_archives(values: list[str], own: Path) -> dict[str, Path]:
    """``--pool LABEL=ARCHIVE`` values as {label: archive}, each checked before anything runs:
    a new label, a file, no archive twice and not this run's own (``own``)."""
    out: dict[str, Path] = {}
    seen = {_sha256(own): "this run's --archive"} if own.is_file() else {}
    for value in values:
        label, sep, path = value.partition("=")
        if not (sep and label and path) or label in out or label == THIS_RUN:
            raise SystemExit(f"--pool {value!r}: give LABEL=ARCHIVE, a new label for each")
        if not Path(path).is_file():
            raise SystemExit(f"--pool {value!r}: no such file {path}")
        digest = _sha256(Path(path))
        if digest in seen:
            raise SystemExit(
                f"--pool {value!r}: the same archive as {seen[digest]}; pool a run once"
            )
        seen[digest] = f"--pool {label}"
        out[label] = Path(path)
    return out


def _pooled(report: dict[str, Any], pool: dict[str, Path], split: Path) -> dict[str, Any]:
    """:func:`pooled_verdict` of this run's ``report`` and the archives in ``pool``, each analysed
    by this tree under ``split``; with each archive's sha256, the split it was collected under
    and its own ablation table."""
    runs, archives = {THIS_RUN: report["models"]}, {}
    for label, archive in pool.items():
        with tempfile.TemporaryDirectory(prefix="commprof-step-model-") as tmp:
            other = _report(unpack(archive, Path(tmp)), split)
        if other["split_as_collected"].startswith("differs"):
            raise SystemExit(
                f"--pool {label}: {other['split_as_collected']}; pool runs of one split"
            )
        runs[label] = other["models"]
        archives[label] = {
            "sha256": _sha256(archive), "split_as_collected": other["split_as_collected"],
            "ablation": other["summary"]["ablation"],
        }  # fmt: skip
    return {**pooled_verdict(runs), "archives": archives}


def result_name(split: Path) -> str:
    """The result's and ledger's name of a run of ``split``: ``step_model`` for the committed
    split alone, else ``step_model_<stem>`` (``step_model_unseen.yaml``: ``step_model_unseen``;
    another file called ``step_model.yaml``: ``step_model_step_model``, never the committed
    split's result)."""
    if split.resolve() == SPLIT_FILE.resolve():
        return "step_model"
    stem = split.stem
    return stem if stem.startswith("step_model_") else f"step_model_{stem}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="default 4; 1 with --smoke")
    parser.add_argument("--budget-s", type=float, default=1200.0, help="no new round after this")
    parser.add_argument("--split", type=Path, default=SPLIT_FILE, help="the declared split (YAML)")
    parser.add_argument(
        "--data", type=Path, default=None,
        help=f"dataset folder: where a collection writes (default {SCRATCH}), or what "
        "--analyze-only reads in place of --archive",
    )  # fmt: skip
    parser.add_argument(
        "--archive", type=Path, default=None,
        help="the dataset, compressed (default: results/<name>_data.tar.gz, <name> the split's)",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=None,
        help="the report (default: results/<name>.json; <name> is step_model for the committed "
        "split, the file's name for another)",
    )  # fmt: skip
    parser.add_argument("--analyze-only", action="store_true", help="reuse the kept dataset")
    parser.add_argument("--collect-only", action="store_true", help="collect, analyze later")
    parser.add_argument(
        "--smoke", action="store_true",
        help=f"{', '.join(SMOKE_MODELS)} only (else the split's first model), "
        f"1/{SMOKE_PAIR_DIVISOR} of the pairs' cycles, one round unless --rounds is given "
        "(checks the script)",
    )  # fmt: skip
    parser.add_argument(
        "--pool", action="append", default=[], metavar="LABEL=ARCHIVE",
        help="an earlier run's archive of the same split (git show COMMIT:benchmarks/results/"
        "step_model_data.tar.gz), analysed by this tree; the ablation's verdict pools it with "
        "this run's (repeat the flag for several)",
    )  # fmt: skip
    ledger.add_change_argument(parser)
    args = parser.parse_args()
    name = result_name(args.split)
    results_dir = SCRATCH.parent if args.smoke else REPO / "benchmarks/results"  # smoke: never
    smoke = "_smoke" if args.smoke else ""  # over the kept result
    args.out = args.out or results_dir / f"{name}{smoke}.json"
    args.archive = args.archive or results_dir / f"{name}{smoke}_data.tar.gz"
    if args.pool and args.collect_only:
        raise SystemExit("--pool needs the analysis: leave out --collect-only")
    pool = _pool_archives(args.pool, args.archive if args.analyze_only else Path())
    split = load_split(args.split)
    if args.smoke and args.rounds == parser.get_default("rounds"):
        args.rounds = 1

    if args.analyze_only:
        if args.data is not None:
            report = _report(args.data, args.split)
        else:
            with tempfile.TemporaryDirectory(prefix="commprof-step-model-") as tmp:
                report = _report(unpack(args.archive, Path(tmp)), args.split)
    else:
        data = args.data or SCRATCH
        if data.exists():
            shutil.rmtree(data)
        load_at_start = os.getloadavg()[0]
        models = split.names
        if args.smoke:
            models = tuple(m for m in split.names if m in SMOKE_MODELS) or split.names[:1]
        divisor = SMOKE_PAIR_DIVISOR if args.smoke else 1
        meta = collect(data, args.rounds, args.budget_s, split, models, divisor)
        meta["environment"] = {**environment("end"), "load_avg_1m_at_start": load_at_start}
        meta["split_sha256"] = split_sha256(args.split)
        (data / "collection.json").write_text(json.dumps(meta, indent=1) + "\n")
        pack(data, args.archive)
        print(f"-> {args.archive}")
        if args.collect_only:
            return 0
        report = _report(data, args.split)
    if pool:
        report["ablation_pooled"] = _pooled(report, pool, args.split)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=1))
    print(ablation_table(report["summary"]))
    if pool:
        print(pooled_table(report["ablation_pooled"]))
    print(f"-> {args.out}")
    if not (args.analyze_only or args.smoke):  # a smoke run is no run of the ledger
        ledger.print_row(
            name, change=args.change, figures=headline(report),
            files=[args.out, args.archive],
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
