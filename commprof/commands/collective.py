"""``commprof collective``: predicted nccl-tests tables for a cluster you may not have.

Prints a table shaped like nccl-tests' (size, time, algbw, busbw, and the algorithm and protocol
NCCL would pick) so the two can be diffed; ``--json`` prints a list of rows and nothing else on
stdout. ``--fit LOG ...`` calibrates the description on nccl-tests logs of that cluster first
(``commprof.modeling.collective.calibration.calibrate``). Every time carries its 80 % interval
(``low``, ``high``; ``time_us_low``, ``time_us_high`` in ``--json``). Torch-free.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from commprof.modeling.collective.calibration import calibrate
from commprof.modeling.collective.calibration_fit import DESCRIPTION
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import COLLECTIVES
from commprof.modeling.collective.fitted_model import predict
from commprof.modeling.collective.nccl_log import read_logs
from commprof.modeling.collective.nccl_log_collective import placement_summary, skipped_summary
from commprof.modeling.collective.scale_rule import interval_basis

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_ROWS = 64
"""Most sizes one table prints (doubling from --min-bytes)."""


def byte_size(text: str) -> int:
    """A size flag as nccl-tests takes it: ``8``, ``1M``, ``4G`` (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)B?\s*", text, flags=re.IGNORECASE)
    if m is None or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a size such as 8, 1M or 4G (>= 1 byte)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``commprof collective`` options to a parser."""
    parser.add_argument("--cluster", required=True, help="a bundled cluster name or a YAML file")
    parser.add_argument("--world-size", type=int, required=True, help="ranks (whole nodes)")
    parser.add_argument("--collective", default="all_reduce", choices=COLLECTIVES)
    parser.add_argument("--min-bytes", type=byte_size, default=1 << 20, help="default 1M")
    parser.add_argument("--max-bytes", type=byte_size, default=4 << 30, help="default 4G")
    parser.add_argument(
        "--fit",
        nargs="+",
        action="extend",
        metavar="LOG",
        help="nccl-tests logs of this cluster to calibrate on, text or -J JSON (repeat or list: "
        "every one is kept)",
    )
    parser.add_argument(
        "--run",
        metavar="K|all",
        help="with --fit: run K of each log, or 'all' runs (a file of several runs needs it)",
    )
    parser.add_argument("--json", action="store_true", help="a JSON list of rows on stdout")


def sizes_between(min_bytes: int, max_bytes: int) -> list[int]:
    """Doubling sizes from ``min_bytes`` to ``max_bytes``, as nccl-tests' ``-f 2``."""
    if min_bytes > max_bytes:
        raise ValueError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    out = [min_bytes]
    while out[-1] * 2 <= max_bytes:
        out.append(out[-1] * 2)
    if len(out) > MAX_ROWS:
        raise ValueError(f"{len(out)} sizes from --min-bytes to --max-bytes; at most {MAX_ROWS}")
    return out


def run(args: argparse.Namespace) -> int:
    """Entry of ``commprof collective``."""
    cluster = load_cluster(args.cluster)
    fit = DESCRIPTION
    if args.run and not args.fit:
        raise ValueError(f"--run {args.run}: give the logs it picks from with --fit LOG ...")
    logs = read_logs(args.fit, args.run, args.collective) if args.fit else []
    if logs:
        for log in logs:
            for said in (skipped_summary(log), placement_summary(log, cluster.gpus_per_node)):
                if said is not None:
                    print(f"commprof collective: {said}", file=sys.stderr)
        fit = calibrate(cluster, logs, args.collective)
    rows = predict(
        cluster,
        args.world_size,
        sizes_between(args.min_bytes, args.max_bytes),
        args.collective,
        fit,
    )
    anchored = fit.anchor(args.world_size, args.collective) is not None
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "bytes": r.num_bytes,
                        "time_us": r.time_us,
                        "time_us_low": r.time_us_low,
                        "time_us_high": r.time_us_high,
                        "algbw_gbps": r.algbw_gbps,
                        "busbw_gbps": r.busbw_gbps,
                        "algorithm": r.algorithm,
                        "protocol": r.protocol,
                        "follows_log": anchored,
                    }
                    for r in rows
                ]
            )
        )
        return 0
    nodes = cluster.nodes_for(args.world_size)
    fitted = "description alone" if not args.fit else f"calibrated on {len(logs)} log(s)"
    half = rows[0].time_us_high / rows[0].time_us - 1 if rows else 0.0
    basis = interval_basis(fit, args.world_size, args.collective, nodes)
    print(f"# {args.collective}, cluster {cluster.name} ({cluster.description})")
    said = (
        f"the fitted logs' own times at these ranks ({fitted})"
        if anchored
        else f"predicted ({fitted}), not measured"
    )
    print(f"# {args.world_size} ranks on {nodes} node(s); {said}")
    factor = 1 + half
    print(f"# 80 % interval: low = time / {factor:.2f}, high = time x {factor:.2f} ({basis})")
    print(
        f"#{'size':>12} {'time':>10} {'low':>10} {'high':>10} {'algbw':>8} {'busbw':>8}  "
        f"{'algorithm':<10} protocol"
    )
    print(f"#{'(B)':>12} {'(us)':>10} {'(us)':>10} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    for r in rows:
        print(
            f"{r.num_bytes:>13} {r.time_us:>10.1f} {r.time_us_low:>10.1f} {r.time_us_high:>10.1f} "
            f"{r.algbw_gbps:>8.2f} {r.busbw_gbps:>8.2f}  {r.algorithm:<10} {r.protocol}"
        )
    return 0
