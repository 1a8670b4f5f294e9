"""Benchmark: commprof's trace parser on every trace shape, beside HTA 0.5.0 and the decode floor.

Four shapes of about a million events each (``make_trace_shapes.py``: kernel-heavy, CPU-op-heavy
with Python stacks, communication-heavy with many small collectives on a lagging ROCm GPU, and
the mixed GPT-2 DDP rank), and a job of ``--ranks`` small ranks; ``--shape kernel_heavy_150k``
runs issue #43's kernel-heavy trace of 150k collectives in 1M events (not in the default set).
Per shape, side by side in one run, each side in a fresh process of its own venv:

- commprof: ``parse_trace(path)`` then ``trace_overlap(parsed)`` (whole-trace overlap);
- floor: gunzip the file, then one ``msgspec`` decode of the whole document into typed structs of
  the fields commprof keeps (``ColumnBuilder.event_type``: ph, cat, name, pid, tid, ts, dur and
  the args keys of its rules; the one decode no parser of this decoder can skip);
- HTA 0.5.0: ``TraceAnalysis(trace_dir=..., include_last_profiler_step=True)`` then
  ``get_comm_comp_overlap`` (its own venv, pandas 2.2.3; requirements-hta.txt).

Times are CPU seconds of the measured section (``time.process_time`` of the side's process,
its children's added), imports excluded; peak RSS is the side's whole process (a wrapper's
``RUSAGE_CHILDREN``). commprof and the floor run ``--repeats`` times alternating (medians),
HTA once. Goals (issue #29): HTA / commprof >= 25, commprof / floor <= 1.5, RSS commprof / HTA
<= 0.25 on every shape.

The job of ``--ranks`` ranks (comm_heavy, small traces) is analysed by ``commprof.traces.analyze``
locally (worker processes) and as Ray tasks: the driver's peak RSS over its RSS before the
analysis, against one rank parsed alone (its peak over its RSS after imports) and their sum.
Goal: the driver's growth bounded by a few ranks' worth, not the sum.

Usage::

    flock -x /tmp/commprof-bench.lock python benchmarks/bench_trace_shapes.py
    python benchmarks/bench_trace_shapes.py --min-events 30000 --ranks 8 --skip-hta \\
        --out /tmp/smoke.json                                                    # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ledger

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = HERE / "results" / "trace_shapes.json"
DEFAULT_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "commprof-bench" / "shapes"
DEFAULT_HTA_PYTHON = "/tmp/hta-venv/bin/python"
SHAPES = ("kernel_heavy", "cpu_heavy", "comm_heavy", "mixed")
"""The shapes run by default."""
ALL_SHAPES = (*SHAPES, "kernel_heavy_150k")
SPEEDUP_TARGET = 25.0
FLOOR_TARGET = 1.5
MEMORY_TARGET = 0.25
FEW_RANKS = 4.0
"""The driver's RSS growth may be at most this many ranks' parse growth."""


# ------------------------------------------------------------- workers (in the side's venv)


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def _cpu() -> float:
    own = time.process_time()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + kids.ru_utime + kids.ru_stime


def _worker_commprof(trace: Path) -> dict[str, Any]:
    from commprof.traces.metrics import trace_overlap
    from commprof.traces.trace_parser import parse_trace

    t0 = _cpu()
    parsed = parse_trace(trace)
    comm_ns, overlap_ns = trace_overlap(parsed)
    return {
        "cpu_s": _cpu() - t0,
        "overlap_pct": 100.0 * overlap_ns / comm_ns if comm_ns else None,
        "regime": parsed.regime,
        "num_collectives": len(parsed.collectives),
        "num_outside": len(parsed.outside),
    }


def _worker_floor(trace: Path) -> dict[str, Any]:
    import msgspec
    from isal import igzip  # the decompressor commprof's reader uses (commprof.traces.gunzip)

    from commprof.traces.column_builder import ColumnBuilder
    from commprof.traces.trace_rules import RULES

    event = ColumnBuilder(str(trace), RULES.values()).event_type
    doc = msgspec.defstruct("Trace", [("traceEvents", list[event])])  # type: ignore[valid-type]
    decoder = msgspec.json.Decoder(doc)
    t0 = _cpu()
    with igzip.open(trace, "rb") as fh:
        data = fh.read()
    t1 = _cpu()
    num_events = len(decoder.decode(data).traceEvents)
    return {"cpu_s": _cpu() - t0, "gunzip_cpu_s": t1 - t0, "num_events": num_events}


def _worker_hta(trace: Path) -> dict[str, Any]:
    import logging

    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    t0 = _cpu()
    analyzer = TraceAnalysis(trace_dir=str(trace.parent), include_last_profiler_step=True)
    df = analyzer.get_comm_comp_overlap(visualize=False)
    return {"cpu_s": _cpu() - t0, "overlap_pct": float(df["comp_comm_overlap_pctg"].iloc[0])}


def _worker_one_rank(trace: Path) -> dict[str, Any]:
    from commprof.traces.rank_pool import analyze_file

    before = _rss_kib()
    outcome = analyze_file(str(trace), {})
    assert outcome.result is not None, outcome.error
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"rss_before_kib": before, "peak_kib": peak, "growth_kib": peak - before}


def _worker_ranks(folder: Path, use_ray: bool) -> dict[str, Any]:
    import warnings

    from commprof.traces.analyze import analyze

    if use_ray:
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    before = _rss_kib()
    t0, wall0 = _cpu(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = analyze(folder, use_ray=use_ray)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "driver_cpu_s": _cpu() - t0,
        "wall_s": time.perf_counter() - wall0,
        "rss_before_kib": before,
        "peak_kib": peak,
        "growth_kib": peak - before,
        "num_ranks": len(analysis.ranks),
        "num_collectives": len(analysis.per_rank["collectives"]),
        "matched": 0 if analysis.cross is None else len(analysis.cross.collectives),
    }
    if use_ray:
        ray.shutdown()
    return out


# ------------------------------------------------------------- driver


def _measure(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    wrapper = [sys.executable, str(Path(__file__).resolve()), "--_measure", "--", *cmd]
    proc = subprocess.run(wrapper, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[3:]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measure_main(cmd: list[str]) -> int:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.perf_counter() - t0
    result["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps(result))
    return 0


def _side(side: str, python: str, *args: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("HTA_DISABLE_NS_ROUNDING", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return _measure([python, str(Path(__file__).resolve()), "--_worker", side, *args], env)


def _build(out_dir: Path, shapes: list[str], min_events: int, ranks: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    import make_trace_shapes

    built: dict[str, Any] = {}
    for shape in shapes:
        folder = out_dir / shape
        found = sorted(folder.glob("*.json.gz")) if folder.is_dir() else []
        if not found:
            print(f"building {shape} ...", file=sys.stderr)
            built[shape] = make_trace_shapes.write_shape(shape, folder, min_events=min_events)
            found = [Path(built[shape]["path"])]
        built.setdefault(shape, {"path": str(found[0])})
    folder = out_dir / f"ranks{ranks}"
    if ranks and not (folder.is_dir() and len(list(folder.glob("*.json.gz"))) == ranks):
        print(f"building {ranks} ranks ...", file=sys.stderr)
        for r in range(ranks):
            make_trace_shapes.write_shape(
                "comm_heavy", folder, min_events=20_000, rank=r, world_size=ranks,
                offset_ns=(r * 7919) % 5_000_000,
            )  # fmt: skip
    built["ranks"] = str(folder)
    return built


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _shape(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    for _ in range(2):  # warm the page cache: no side pays the disk
        path.read_bytes()
    runs: dict[str, list[dict[str, Any]]] = {"floor": [], "commprof": []}
    for i in range(args.repeats):
        for side in ("floor", "commprof"):
            print(f"{side} {i + 1} on {path.parent.name} ...", file=sys.stderr)
            runs[side].append(_side(side, sys.executable, str(path)))
    one: dict[str, Any] = {"file_bytes": path.stat().st_size, "runs": runs}
    one["num_events"] = runs["floor"][0]["num_events"]
    cp, fl = _median(runs["commprof"], "cpu_s"), _median(runs["floor"], "cpu_s")
    cp_rss = max(r["peak_rss_kib"] for r in runs["commprof"]) / 1024
    one["ratios"] = {"commprof_cpu_s": cp, "floor_cpu_s": fl, "commprof_over_floor": cp / fl,
                     "commprof_peak_rss_mib": cp_rss}  # fmt: skip
    if not args.skip_hta:
        print(f"hta on {path.parent.name} ...", file=sys.stderr)
        hta = _side("hta", args.hta_python, str(path))
        one["hta"] = hta
        one["ratios"] |= {
            "hta_cpu_s": hta["cpu_s"],
            "hta_over_commprof": hta["cpu_s"] / cp,
            "hta_peak_rss_mib": hta["peak_rss_kib"] / 1024,
            "rss_commprof_over_hta": cp_rss / (hta["peak_rss_kib"] / 1024),
            "overlap_pct_commprof": runs["commprof"][0]["overlap_pct"],
            "overlap_pct_hta": hta["overlap_pct"],
        }
    r = one["ratios"]
    r["pass"] = {
        "floor": r["commprof_over_floor"] <= FLOOR_TARGET,
        **({"speed": r["hta_over_commprof"] >= SPEEDUP_TARGET,
            "memory": r["rss_commprof_over_hta"] <= MEMORY_TARGET} if "hta_cpu_s" in r else {}),
    }  # fmt: skip
    return one


def _ranks(folder: Path) -> dict[str, Any]:
    files = sorted(folder.glob("*.json.gz"))
    print(f"{len(files)} ranks: one rank alone, local, Ray ...", file=sys.stderr)
    one = _side("one_rank", sys.executable, str(files[0]))
    local = _side("ranks", sys.executable, str(folder), "local")
    on_ray = _side("ranks", sys.executable, str(folder), "ray")
    unit = one["growth_kib"]
    out = {"num_ranks": len(files), "one_rank": one, "local": local, "ray": on_ray}
    out["ratios"] = {
        "one_rank_growth_mib": unit / 1024,
        "sum_of_ranks_mib": unit * len(files) / 1024,
        "local_driver_growth_mib": local["growth_kib"] / 1024,
        "ray_driver_growth_mib": on_ray["growth_kib"] / 1024,
        "local_in_ranks": local["growth_kib"] / unit,
        "ray_in_ranks": on_ray["growth_kib"] / unit,
    }
    out["ratios"]["pass"] = (
        max(out["ratios"]["local_in_ranks"], out["ratios"]["ray_in_ranks"]) <= FEW_RANKS
    )
    return out


def headline(result: dict[str, Any]) -> str:
    parts = []
    for shape, one in result["shapes"].items():
        r = one["ratios"]
        text = f"{shape}: floor {r['commprof_over_floor']:.2f}"
        if "hta_over_commprof" in r:
            text += f", HTA {r['hta_over_commprof']:.1f}x, RSS {r['rss_commprof_over_hta']:.2f}"
        parts.append(text)
    if "ranks" in result:
        r = result["ranks"]["ratios"]
        parts.append(
            f"{result['ranks']['num_ranks']} ranks: driver growth {r['local_in_ranks']:.1f} "
            f"(local) / {r['ray_in_ranks']:.1f} (Ray) ranks' worth"
        )
    load = result["machine"]["loadavg_start"][0], result["machine"]["loadavg_end"][0]
    return "; ".join(parts) + f"; load {load[0]:.1f} to {load[1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_measure"]:
        return _measure_main(argv[2:])
    if argv[:1] == ["--_worker"]:
        side, *rest = argv[1:]
        if side == "ranks":
            print(json.dumps(_worker_ranks(Path(rest[0]), rest[1] == "ray")))
        else:
            workers = {"commprof": _worker_commprof, "floor": _worker_floor, "hta": _worker_hta,
                       "one_rank": _worker_one_rank}  # fmt: skip
            print(json.dumps(workers[side](Path(rest[0]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--min-events", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=128, help="ranks of the small job (0: none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shape", choices=ALL_SHAPES, action="append",
                    help=f"default: {', '.join(SHAPES)}")  # fmt: skip
    ap.add_argument("--hta-python", default=DEFAULT_HTA_PYTHON)
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(ap)
    args = ap.parse_args(argv)
    shapes = args.shape or list(SHAPES)
    built = _build(args.trace_dir, shapes, args.min_events, args.ranks)
    result: dict[str, Any] = {
        "machine": {"num_cpus": os.cpu_count(), "loadavg_start": list(os.getloadavg())},
        "shapes": {},
    }
    for shape in shapes:
        result["shapes"][shape] = _shape(args, Path(built[shape]["path"]))
        print(json.dumps({shape: result["shapes"][shape]["ratios"]}), file=sys.stderr)
    if args.ranks:
        result["ranks"] = _ranks(Path(built["ranks"]))
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="ascii")
    summary = {k: v["ratios"] for k, v in result["shapes"].items()}
    if "ranks" in result:
        summary["ranks"] = result["ranks"]["ratios"]
    print(json.dumps(summary, indent=1))
    ledger.print_row("trace_shapes", change=args.change, figures=headline(result), files=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
