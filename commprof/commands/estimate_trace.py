"""``commprof estimate --trace DIR``: which flags apply, the what-if they ask for, the run.

The replay and the what-if are :mod:`commprof.modeling.trace_whatif` (docs/design.md, "Trace
replay"); this module turns the parsed options into a :class:`~commprof.modeling.trace_whatif.
what_if.WhatIf` and prints the report.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from commprof.caps import check_cap_mb
from commprof.commands.estimate import alpha_ns
from commprof.commands.links import published_link
from commprof.modeling.collective.cluster_link import cluster_link
from commprof.modeling.trace_whatif.replay import Layout, read_timelines, replay
from commprof.modeling.trace_whatif.what_if import (
    WhatIf,
    cap_what_if,
    replay_report,
    report_text,
    trace_world_size,
)

NOT_WITH_TRACE: tuple[tuple[str, str, Any], ...] = (
    ("--fit", "fit", None),
    ("--fit-backend", "fit_backend", "gloo"),
    ("--fit-source", "fit_source", "microbench"),
    ("--timeline", "timeline", None),
    ("--cell", "cell", None),
    ("--batch-tokens", "batch_tokens", None),
    ("--device-tflops", "device_tflops", None),
    ("--recommend-bucket-cap", "recommend_bucket_cap", False),
    ("--same-host", "same_host", False),
    ("--no-interference", "no_interference", False),
    ("--without", "without", None),
)
"""Flags of ``commprof estimate`` that do not apply with ``--trace`` (the trace gives the
compute and the communication timeline): (flag, argparse dest, its default)."""


def check_trace_flags(args: argparse.Namespace) -> None:
    """Refuse, naming the flag, what does not apply with ``--trace`` (before any trace is read).

    Raises:
        ValueError: For the model-input flags of ``NOT_WITH_TRACE``, a published link's flags
            with ``--cluster``, ``--nccl-tests`` without it, and ``--world-size`` without a link.
    """
    bad = [
        flag for flag, dest, default in NOT_WITH_TRACE if getattr(args, dest, default) != default
    ]
    if bad:
        raise ValueError(
            f"{', '.join(bad)} do(es) not apply with --trace (the trace gives the compute and "
            "communication timeline); leave them out"
        )
    link_flags = {
        "--alpha-us": args.alpha_us is not None,
        "--algorithm": args.algorithm is not None,
        "--interconnect-file": args.interconnect_file is not None,
    }
    named = ", ".join(f for f, given in link_flags.items() if given)
    if args.cluster and named:
        raise ValueError(
            f"--cluster {args.cluster}: {named} apply to --interconnect, not a cluster"
        )
    if named and not args.interconnect:
        raise ValueError(f"{named} describe a published link: give --interconnect NAME too")
    if (args.nccl_tests or args.run) and not args.cluster:
        raise ValueError("--nccl-tests LOG calibrates a cluster: give --cluster NAME|FILE")
    if args.world_size is not None and not (args.cluster or args.interconnect):
        raise ValueError(
            f"--world-size {args.world_size} with --trace: give --cluster NAME|FILE or "
            "--interconnect NAME, the collective model that predicts the new all-reduces"
        )


def what_if(args: argparse.Namespace, trace_world_size: int | None) -> WhatIf | None:
    """The what-if of ``--cluster``/``--interconnect`` (and ``--world-size``), None without one.

    Args:
        args: Parsed ``commprof estimate`` options (checked by :func:`check_trace_flags`).
        trace_world_size: The trace's own world size (None where it does not say).
    """
    if not (args.cluster or args.interconnect):
        return None
    world_size = args.world_size if args.world_size is not None else trace_world_size
    if world_size is None:
        raise ValueError("the trace does not say its world size: give --world-size N")
    if args.cluster:
        link = cluster_link(args.cluster, world_size, args.nccl_tests or (), args.run)
        return WhatIf(link=link, label=link.describe(world_size), world_size=world_size)
    params, published = published_link(args, alpha_ns=alpha_ns(args))
    algorithm = params.algorithm
    label = (
        f"{published.name} ({published.per_direction_bytes_per_s / 1e9:.1f} GB/s a direction, "
        f"alpha {params.alpha_ns / 1e3:g} us assumed, {algorithm})"
    )
    return WhatIf(link=params, label=label, world_size=world_size)


def run_trace(args: argparse.Namespace) -> int:
    """Entry of ``commprof estimate --trace DIR``; prints the report or one JSON document.

    Args:
        args: Parsed ``commprof estimate`` options.

    Returns:
        Process exit status.
    """
    check_trace_flags(args)
    # a new cap only where the flag was given (its None, from 'default', is DDP's default)
    given = bool(getattr(args, "bucket_cap_mb_given", False))
    new_cap = check_cap_mb(getattr(args, "bucket_cap_mb", None), "--bucket-cap-mb")
    timelines = read_timelines(args.trace, gradients=given)
    own = trace_world_size(timelines)
    scenario = what_if(args, own)
    cap = cap_what_if(timelines, new_cap, scenario, own) if given else None
    doc = replay_report(timelines, replay, scenario, own, cap, Layout)
    doc["trace"] = str(args.trace)
    print(json.dumps(doc) if args.json else report_text(doc, str(args.trace)))
    return 0
