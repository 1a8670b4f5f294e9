"""Benchmark: commprof's trace parser + overlap vs the decode floor and HolisticTraceAnalysis.

Every side reads the same cuda-nccl Kineto traces (built by make_nccl_trace.py:
about 1,000,000 events, and one ``--scale`` times bigger) and, except the floor,
computes the whole-trace share of communication-kernel time overlapped by
computation kernels:

- commprof: ``parse_trace(path)`` then ``trace_overlap(parsed)`` ->
  ``(comm_ns, overlap_ns)``; percent = 100 * overlap_ns / comm_ns.
- floor: gunzip the whole file, then one ``msgspec.json.decode`` of it into typed
  structs of the fields the parser needs (commprof's own event struct). No parser
  can read the trace faster with this decoder; commprof's goal is at most 2x it.
- HTA 0.5.0: ``TraceAnalysis(trace_dir=..., include_last_profiler_step=True)``
  then ``get_comm_comp_overlap(visualize=False)`` (its
  ``hta/analyzers/communication_analysis.py``: |C and K| / |C| with C, K the
  merged ``^nccl.*Kernel`` and computation kernels of the rank).

HTA rounds float-microsecond events inward to whole microseconds unless
``HTA_DISABLE_NS_ROUNDING=1`` (``hta/common/trace_parser.py``,
``round_down_time_stamps``: ts = ceil(ts), end = floor(ts + dur)). The timed
HTA runs use its defaults; one more run on the first trace with rounding
disabled gives HTA's value on the exact timestamps. A stdlib reference (exact
int ns, same classification as HTA) on the first trace is the third opinion.

Each side runs in its own process, started through a small wrapper process
whose ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is that side's peak RSS alone.
commprof and the floor run ``--repeats`` times, alternating, and report medians
(HTA once per trace: it takes minutes). HTA runs under its own venv
(``--hta-python``, see requirements-hta.txt); commprof under the project's.

Usage::

    python benchmarks/bench_trace_parse.py            # build traces if missing, run, write JSON
    python benchmarks/bench_trace_parse.py --min-events 20000 --scale 2 --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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
DEFAULT_OUT = HERE / "results" / "trace_parse.json"
DEFAULT_TRACE_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "commprof-bench" / "nccl_trace"
DEFAULT_HTA_PYTHON = "/tmp/hta-venv/bin/python"
SPEEDUP_TARGET = 25.0
"""Issue's bar: HTA time / commprof time >= 25."""
FLOOR_TARGET = 2.0
"""Issue's bar: commprof time / decode floor time <= 2."""
MEMORY_TARGET = 1 / 4
"""Issue's bar: commprof peak RSS / HTA peak RSS <= 1/4."""
GROWTH_TARGET = 1.5
"""Issue's bar: commprof peak RSS on the ``--scale`` (4x) trace / on the first <= 1.5."""
OVERLAP_TOLERANCE_POINTS = 0.1
"""Issue's bar: |commprof % - HTA %| <= 0.1 percentage points."""
NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
"""HTA's is_comm_kernel pattern (hta/utils/utils.py)."""


# ---------------------------------------------------------------- workers (run in the side's venv)


def _rss_kib() -> int:
    """Current resident set size of this process (KiB), from /proc."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def _worker_commprof(trace: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    from commprof.traces.metrics import trace_overlap
    from commprof.traces.trace_parser import parse_trace

    t1 = time.perf_counter()
    rss_after_import = _rss_kib()
    parsed = parse_trace(trace)
    t2 = time.perf_counter()
    comm_ns, overlap_ns = trace_overlap(parsed)
    t3 = time.perf_counter()
    return {
        "import_s": t1 - t0,
        "parse_s": t2 - t1,
        "overlap_s": t3 - t2,
        "elapsed_s": t3 - t1,
        "rss_after_import_kib": rss_after_import,
        "comm_ns": int(comm_ns),
        "overlap_ns": int(overlap_ns),
        "overlap_pct": 100.0 * overlap_ns / comm_ns if comm_ns else None,
        "regime": str(getattr(parsed, "regime", "")),
        "imported_torch": "torch" in sys.modules,
        "imported_pandas": "pandas" in sys.modules,
    }


def _worker_floor(trace: Path) -> dict[str, Any]:
    """gunzip + one typed msgspec decode of the whole file (commprof's event struct)."""
    import gzip

    t0 = time.perf_counter()
    import msgspec

    from commprof.traces.column_builder import ColumnBuilder
    from commprof.traces.trace_rules import RULES

    event = ColumnBuilder(str(trace), RULES.values()).event_type
    doc = msgspec.defstruct("Trace", [("traceEvents", list[event])])  # type: ignore[valid-type]
    decoder = msgspec.json.Decoder(doc)
    t1 = time.perf_counter()
    with gzip.open(trace, "rb") if trace.suffix == ".gz" else open(trace, "rb") as fh:
        data = fh.read()
    t2 = time.perf_counter()
    num_events = len(decoder.decode(data).traceEvents)
    t3 = time.perf_counter()
    return {
        "import_s": t1 - t0,
        "gunzip_s": t2 - t1,
        "decode_s": t3 - t2,
        "elapsed_s": t3 - t1,
        "num_events": num_events,
        "overlap_pct": None,
    }


def _worker_hta(trace: Path) -> dict[str, Any]:
    import logging

    t0 = time.perf_counter()
    import hta
    from hta.trace_analysis import TraceAnalysis

    t1 = time.perf_counter()
    logging.getLogger("hta").setLevel(logging.ERROR)
    rss_after_import = _rss_kib()
    analyzer = TraceAnalysis(trace_dir=str(trace.parent), include_last_profiler_step=True)
    t2 = time.perf_counter()
    df = analyzer.get_comm_comp_overlap(visualize=False)
    t3 = time.perf_counter()
    return {
        "import_s": t1 - t0,
        "parse_s": t2 - t1,
        "overlap_s": t3 - t2,
        "elapsed_s": t3 - t1,
        "rss_after_import_kib": rss_after_import,
        "overlap_pct": float(df["comp_comm_overlap_pctg"].iloc[0]),
        "hta_version": getattr(hta, "__version__", "0.5.0"),
        "ns_rounding_disabled": os.environ.get("HTA_DISABLE_NS_ROUNDING", "0") == "1",
    }


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _worker_reference(trace: Path) -> dict[str, Any]:
    """Exact int-ns overlap with HTA's kernel classification, plain Python."""
    import gzip

    t1 = time.perf_counter()
    with gzip.open(trace, "rt") if trace.suffix == ".gz" else open(trace) as fh:
        events = json.load(fh)["traceEvents"]
    comm: list[tuple[int, int]] = []
    comp: list[tuple[int, int]] = []
    for ev in events:
        if ev.get("cat") != "kernel":
            continue
        start = round(ev["ts"] * 1000)
        end = start + round(ev["dur"] * 1000)
        (comm if NCCL_KERNEL_RE.match(ev["name"]) else comp).append((start, end))
    c, k = _merge(comm), _merge(comp)
    overlap_ns, i, j = 0, 0, 0
    while i < len(c) and j < len(k):  # two-pointer sweep over sorted disjoint sets
        overlap_ns += max(0, min(c[i][1], k[j][1]) - max(c[i][0], k[j][0]))
        if c[i][1] < k[j][1]:
            i += 1
        else:
            j += 1
    comm_ns = sum(e - s for s, e in c)
    return {
        "elapsed_s": time.perf_counter() - t1,
        "comm_ns": comm_ns,
        "overlap_ns": overlap_ns,
        "overlap_pct": 100.0 * overlap_ns / comm_ns if comm_ns else None,
        "num_events": len(events),
    }


WORKERS = {
    "commprof": _worker_commprof,
    "floor": _worker_floor,
    "hta": _worker_hta,
    "reference": _worker_reference,
}


# ---------------------------------------------------------------- driver


def _measure(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one side through a fresh wrapper; peak RSS is that side's alone."""
    wrapper = [sys.executable, str(Path(__file__).resolve()), "--_measure", "--", *cmd]
    proc = subprocess.run(wrapper, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[3:]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measure_main(cmd: list[str]) -> int:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.stdout.write(proc.stdout)
        return proc.returncode
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall_s
    # Linux reports ru_maxrss in KiB; this wrapper has exactly one child.
    result["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps(result))
    return 0


def _run_side(
    side: str, python: str, trace: Path, *, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("HTA_DISABLE_NS_ROUNDING", None)
    env.update(env_extra or {})
    if side in ("commprof", "floor"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    cmd = [python, str(Path(__file__).resolve()), "--_worker", side, str(trace)]
    return _measure(cmd, env)


def _python_version(python: str) -> str:
    code = (
        "import sys, pandas, numpy; "
        "print(sys.version.split()[0], pandas.__version__, numpy.__version__)"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() or out.stderr.strip()[-200:]


def _source_hashes() -> dict[str, str]:
    """Which parser version was measured (the files change while work goes on)."""
    import hashlib

    out = {}
    for path in sorted((REPO / "commprof" / "traces").glob("*.py")):  # the reader's package
        out[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return out


def _machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo", encoding="ascii") as fh:
        mem_kib = int(fh.readline().split()[1])
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "num_cpus": os.cpu_count(),
        "mem_total_gib": round(mem_kib / 2**20, 1),
        "loadavg_start": list(os.getloadavg()),
    }


def _find_trace(trace_dir: Path) -> Path | None:
    found = sorted(p for p in trace_dir.glob("*.json*") if p.name.endswith((".json", ".json.gz")))
    return found[0] if found else None


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "runs": runs,
        "elapsed_s_median": statistics.median(r["elapsed_s"] for r in runs),
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "peak_rss_mib_max": max(r["peak_rss_kib"] for r in runs) / 1024,
        "overlap_pct": runs[0]["overlap_pct"],
    }


def _trace(trace_dir: Path, min_events: int, rebuild: bool) -> tuple[Path, dict[str, Any] | None]:
    """The trace in ``trace_dir``, built there first where missing (or ``rebuild``)."""
    sys.path.insert(0, str(HERE))
    import make_nccl_trace

    trace = _find_trace(trace_dir)
    build: dict[str, Any] | None = None
    if trace is None or rebuild:
        if trace is not None:
            trace.unlink()
        print(f"building trace in {trace_dir} ...", file=sys.stderr)
        spec = make_nccl_trace.TraceSpec(min_events=min_events)
        build = make_nccl_trace.write_trace(spec, trace_dir)
        trace = Path(build["path"])
    with open(trace, "rb") as fh:  # warm the page cache so no side pays the disk read
        while fh.read(1 << 24):
            pass
    return trace, build


def _one_trace(args: argparse.Namespace, trace: Path, first: bool) -> dict[str, Any]:
    """Every side on one trace; the reference and exact-timestamp HTA only on the first."""
    out: dict[str, Any] = {"trace": {"path": str(trace), "file_bytes": trace.stat().st_size}}
    if first:
        print("reference ...", file=sys.stderr)
        out["reference"] = _run_side("reference", args.commprof_python, trace)
    sides: dict[str, list[dict[str, Any]]] = {"floor": [], "commprof": []}
    for i in range(args.repeats):  # alternate sides so background load hits both alike
        for side in ("floor", "commprof"):
            print(f"{side} run {i + 1} on {trace.name} ...", file=sys.stderr)
            sides[side].append(_run_side(side, args.commprof_python, trace))
    out["trace"]["num_events"] = sides["floor"][0]["num_events"]
    out["floor"], out["commprof"] = _summary(sides["floor"]), _summary(sides["commprof"])
    if not args.skip_hta and (first or not args.skip_hta_scaled):
        print(f"hta on {trace.name} ...", file=sys.stderr)
        out["hta"] = _summary([_run_side("hta", args.hta_python, trace)])
    if first and not args.skip_hta:
        print("hta with HTA_DISABLE_NS_ROUNDING=1 ...", file=sys.stderr)
        exact = {"HTA_DISABLE_NS_ROUNDING": "1"}
        out["hta_exact_timestamps"] = _run_side("hta", args.hta_python, trace, env_extra=exact)
    return out


def _compare(one: dict[str, Any]) -> dict[str, Any]:
    """Ratios and pass flags of one trace's sides."""
    cp, floor = one["commprof"], one["floor"]
    out: dict[str, Any] = {
        "commprof_over_floor": cp["elapsed_s_median"] / floor["elapsed_s_median"],
        "commprof_wall_over_floor_wall": cp["wall_s_median"] / floor["wall_s_median"],
    }
    out["pass_floor"] = out["commprof_over_floor"] <= FLOOR_TARGET
    if "hta" in one:
        ht = one["hta"]
        out["speedup_hta_over_commprof"] = ht["elapsed_s_median"] / cp["elapsed_s_median"]
        out["speedup_wall_incl_imports"] = ht["wall_s_median"] / cp["wall_s_median"]
        out["peak_rss_ratio_commprof_over_hta"] = cp["peak_rss_mib_max"] / ht["peak_rss_mib_max"]
        out["pass_speedup"] = out["speedup_hta_over_commprof"] >= SPEEDUP_TARGET
        out["pass_memory"] = out["peak_rss_ratio_commprof_over_hta"] <= MEMORY_TARGET
        out["overlap_pct_commprof"] = cp["overlap_pct"]
        out["overlap_pct_hta_default"] = ht["overlap_pct"]
    exact = one.get("hta_exact_timestamps", {}).get("overlap_pct")
    if exact is not None:
        out["overlap_pct_hta_exact_timestamps"] = exact
        out["diff_points_vs_hta_exact"] = cp["overlap_pct"] - exact
        out["pass_overlap_vs_hta_exact"] = (
            abs(cp["overlap_pct"] - exact) <= OVERLAP_TOLERANCE_POINTS
        )
    if "reference" in one:
        out["overlap_pct_reference"] = one["reference"]["overlap_pct"]
    return out


def headline(result: dict[str, Any]) -> str:
    """The ledger's figures: per trace commprof / floor and HTA / commprof (median times), peak
    RSS commprof / HTA, peak RSS growth with the trace, the load average."""
    parts = []
    for label, one in result["traces"].items():
        c = one["comparison"]
        figures = [f"commprof / floor {c['commprof_over_floor']:.2f}"]
        if "speedup_hta_over_commprof" in c:
            figures.append(f"HTA / commprof {c['speedup_hta_over_commprof']:.1f}")
        if "peak_rss_ratio_commprof_over_hta" in c:
            figures.append(f"RSS commprof / HTA {c['peak_rss_ratio_commprof_over_hta']:.2f}")
        parts.append(f"{label}: {', '.join(figures)}")
    growth = result["growth"]["commprof_peak_rss_ratio"]
    load = result["machine"]["loadavg_start"][0], result["machine"]["loadavg_end"][0]
    return f"{'; '.join(parts)}; RSS growth {growth:.2f}; load {load[0]:.1f} to {load[1]:.1f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_measure"]:
        return _measure_main(argv[2:])
    if argv[:1] == ["--_worker"]:
        print(json.dumps(WORKERS[argv[1]](Path(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--trace-dir", type=Path, default=DEFAULT_TRACE_DIR, help="folder of the first trace"
    )
    ap.add_argument("--min-events", type=int, default=1_000_000, help="events of the first trace")
    ap.add_argument(
        "--scale", type=int, default=4, help="the second trace is this many times bigger"
    )
    ap.add_argument("--rebuild", action="store_true", help="rebuild the traces even if present")
    ap.add_argument("--hta-python", default=DEFAULT_HTA_PYTHON, help="python of HTA's venv")
    ap.add_argument("--commprof-python", default=sys.executable, help="python of the project")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of commprof and the floor")
    ap.add_argument("--skip-hta", action="store_true", help="floor and commprof only")
    ap.add_argument(
        "--skip-hta-scaled", action="store_true", help="HTA on the first trace only (slow)"
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ledger.add_change_argument(ap)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.scale < 2:
        raise ValueError(f"need --repeats >= 1 and --scale >= 2, got {args.repeats}, {args.scale}")
    result: dict[str, Any] = {"machine": _machine(), "traces": {}}
    scaled_dir = args.trace_dir.with_name(f"{args.trace_dir.name}_x{args.scale}")
    for label, trace_dir, min_events in (
        ("x1", args.trace_dir, args.min_events),
        (f"x{args.scale}", scaled_dir, args.scale * args.min_events),
    ):
        trace, build = _trace(trace_dir, min_events, args.rebuild)
        one = _one_trace(args, trace, first=label == "x1")
        one["build"] = build
        one["comparison"] = _compare(one)
        result["traces"][label] = one
    x1, xn = result["traces"]["x1"], result["traces"][f"x{args.scale}"]
    growth = xn["commprof"]["peak_rss_mib_max"] / x1["commprof"]["peak_rss_mib_max"]
    result["growth"] = {
        "events_ratio": xn["trace"]["num_events"] / x1["trace"]["num_events"],
        "commprof_peak_rss_ratio": growth,
        "commprof_time_ratio": xn["commprof"]["elapsed_s_median"]
        / x1["commprof"]["elapsed_s_median"],
        "pass_growth": growth <= GROWTH_TARGET,
    }
    result["versions"] = {
        "commprof_python": _python_version(args.commprof_python),
        "hta_python": _python_version(args.hta_python),
        "commprof_sources_sha256": _source_hashes(),
    }
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="ascii")
    summary = {k: v["comparison"] for k, v in result["traces"].items()}
    print(json.dumps({**summary, "growth": result["growth"]}, indent=2, default=str))
    ledger.print_row("trace_parse", change=args.change, figures=headline(result), files=[args.out])
    return 0


if __name__ == "__main__":
    sys.exit(main())
