"""``commprof estimate --trace DIR``: the what-if a request asks of a trace, and its prediction.

The replay and the what-if are :mod:`commprof.modeling.trace_whatif` (docs/design.md, "Trace
replay"); this module turns a validated request (``EstimateRequest.validate`` says which flags
apply with ``--trace``) into a :class:`~commprof.modeling.trace_whatif.what_if.WhatIf` on its
link (``commands.links.resolve_link``) and returns the report as one
:class:`~commprof.modeling.prediction.Prediction`.
"""

from __future__ import annotations

from commprof.caps import check_cap_mb
from commprof.commands.estimate_request import EstimateRequest
from commprof.commands.links import resolve_link
from commprof.modeling.prediction import Prediction
from commprof.modeling.trace_whatif.replay import Layout, read_timelines, replay
from commprof.modeling.trace_whatif.what_if import (
    WhatIf,
    assumptions,
    cap_what_if,
    replay_report,
    report_text,
    trace_world_size,
)


def what_if(request: EstimateRequest, trace_world_size: int | None) -> WhatIf | None:
    """The what-if of ``--cluster``/``--interconnect`` (and ``--world-size``), None without one.

    Args:
        request: A validated request with ``--trace``.
        trace_world_size: The trace's own world size (None where it does not say).
    """
    if not (request.cluster or request.interconnect):
        return None
    world_size = request.world_size if request.world_size is not None else trace_world_size
    if world_size is None:
        raise ValueError("the trace does not say its world size: give --world-size N")
    resolved = resolve_link(request, world_size)
    assert resolved.link is not None and resolved.label is not None  # a link was named
    return WhatIf(link=resolved.link, label=resolved.label, world_size=world_size)


def predict_trace(request: EstimateRequest) -> Prediction:
    """``estimate --trace DIR``: every step of the trace replayed as measured and, with a link
    or a cap, as the what-if predicts it."""
    # a new cap only where the flag was given (its None, from 'default', is DDP's default)
    given = request.bucket_cap_mb_given
    new_cap = check_cap_mb(request.bucket_cap_mb, "--bucket-cap-mb")
    trace = str(request.trace)
    timelines = read_timelines(trace, gradients=given)
    own = trace_world_size(timelines)
    scenario = what_if(request, own)
    cap = cap_what_if(timelines, new_cap, scenario, own) if given else None
    doc = replay_report(timelines, replay, scenario, own, cap, Layout)
    return Prediction(
        mode="trace",
        link=None if scenario is None else scenario.label,
        world_size=own if scenario is None else scenario.world_size,
        interval=None,
        assumptions=assumptions(scenario, cap),
        body={"trace": trace, **doc},
        lines=(report_text(doc, trace),),
    )
