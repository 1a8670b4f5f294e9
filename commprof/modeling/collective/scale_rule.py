"""The collective model's 80 % intervals and its scale correction: the rule development systems fix.

:data:`RULE` is ``collective_scale.yaml``, written by ``benchmarks/bench_collective_scale.py``
from the development systems only: how wide an interval is (:func:`halfwidth_log`, said in words
by :func:`interval_basis`) and how much of the network's rate a larger fabric loses
(:func:`net_loss`). :func:`commprof.modeling.collective.fitted_model.predict` applies both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from importlib import resources

from commprof.modeling.collective.calibration_fit import Fit
from commprof.yamlio import load_yaml


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleRule:
    """What the development systems fix (``collective_scale.yaml``): how wide an 80 % interval
    is, in ``|log(predicted / measured)|``, and the network's loss past the nodes fitted."""

    description_log: float
    """Half-width of the description alone (its 80th percentile on development systems)."""
    calibrated_floor_log: float
    """Least half-width of a calibrated prediction (added to nothing below its own in-sample
    80th percentile)."""
    per_doubling_log: float
    """Added per doubling of nodes past the most nodes fitted."""
    ring_loss_per_doubling: float
    """The scale correction of a ring: past ``max(2, calibrated_nodes)`` nodes a calibrated
    ring's network side (bandwidth and hop latency) runs at ``1 / (1 + c log2(N / max(2,
    calibrated_nodes)))`` of its fitted rate, ``c`` this value (a larger fabric's congestion and
    adaptive routing, which one or two nodes cannot show)."""
    tree_loss_per_doubling: float
    """The same for a tree (``tree``, ``nvls_tree``). NCCL's ring joins each node to the next in
    the job's order; its trees join node ``r`` to nodes ``2^(k-1)`` away, ``2^k`` the lowest set
    bit of ``r`` (src/graph/trees.cc), so a growing share of a tree's edges spans the far parts
    of a larger fabric (dragonfly groups, fat-tree spines), whose links other traffic shares."""
    description_ring_loss_per_doubling: float
    """The ring's correction on the description alone, past two nodes: its published rates are
    a fabric's best, which a larger fabric's traffic does not reach either."""
    description_tree_loss_per_doubling: float
    """The tree's correction on the description alone, past two nodes."""


def _load_rule() -> ScaleRule:
    text = resources.files("commprof.modeling.collective").joinpath("collective_scale.yaml")
    data = load_yaml(text.read_text("utf-8"), "collective_scale.yaml")
    names = {f.name for f in fields(ScaleRule)}
    if not isinstance(data, dict) or set(data) != names:
        raise ValueError(f"collective_scale.yaml: needs exactly the keys {sorted(names)}")
    return ScaleRule(**{k: float(v) for k, v in data.items()})


RULE = _load_rule()
"""The committed rule (fitted on development systems by benchmarks/bench_collective_scale.py)."""


def halfwidth_log(fit: Fit, num_nodes: int, rule: ScaleRule = RULE) -> float:
    """Half-width of the 80 % interval in log space at ``num_nodes``: a calibration's
    (:func:`calibrated_halfwidth_log`), or ``rule.description_log`` for the description alone."""
    if fit.calibrated_nodes == 0:
        return rule.description_log
    return calibrated_halfwidth_log(fit.residual_log_q80, fit.calibrated_nodes, num_nodes, rule)


def calibrated_halfwidth_log(
    residual_log_q80: float, calibrated_nodes: int, num_nodes: int, rule: ScaleRule = RULE
) -> float:
    """Half-width of a calibrated prediction's 80 % interval in log space at ``num_nodes``.

    The fit's own in-sample 80th percentile (at least ``calibrated_floor_log``) plus
    ``per_doubling_log`` per doubling of nodes past the most nodes fitted: the validation's
    spread grows with extrapolation distance. A calibration on one node saw no network, and on
    more nodes predicts with the description's: its interval there is at least the
    description's (``description_log``).
    """
    base = max(residual_log_q80, rule.calibrated_floor_log)
    width = base + rule.per_doubling_log * max(0.0, math.log2(num_nodes / calibrated_nodes))
    if calibrated_nodes == 1 and num_nodes > 1:
        width = max(width, rule.description_log)
    return width


def interval_basis(fit: Fit, world_size: int, collective: str, nodes: int) -> str:
    """Where a prediction and its interval come from, in words, for output."""
    if fit.anchor(world_size, collective) is not None:
        return (
            f"the fitted log(s) measured {world_size} ranks: their own times, interpolated "
            "between their sizes; the interval from leaving each size out"
        )
    if fit.calibrated_nodes == 0:
        return "the description's spread on the development systems' nccl-tests logs"
    doublings = max(0.0, math.log2(nodes / fit.calibrated_nodes))
    unseen_network = fit.calibrated_nodes == 1 and nodes > 1
    if unseen_network and halfwidth_log(fit, nodes) == RULE.description_log:
        return (
            f"the description's spread on the development systems' nccl-tests logs: the logs "
            f"fitted are of one node and saw no network, which {nodes} nodes cross"
        )
    if doublings == 0:
        nodes_fitted = f"{fit.calibrated_nodes} node(s) fitted"
        return f"the calibration's residuals on its logs, within the {nodes_fitted}"
    return (
        f"the calibration's residuals on its logs, widened for {nodes} nodes: {doublings:.3g} "
        f"doubling(s) past the {fit.calibrated_nodes} node(s) fitted (rule fitted on development "
        "systems)"
    )


def net_loss(fit: Fit, num_nodes: int, rule: ScaleRule, algorithm: str) -> float:
    """The scale correction's factor on ``algorithm``'s network side at ``num_nodes``: past the
    nodes fitted (``ScaleRule.ring_loss_per_doubling`` or ``tree_loss_per_doubling``), or past
    two nodes with no fit (the ``description_`` ones); 1.0 within them. Every algorithm but the
    ring is a tree across nodes (``collectives.ALGORITHMS``: NVLS stays on one node)."""
    ring = algorithm == "ring"
    if fit.calibrated_nodes == 0:
        reach = 2
        c = (
            rule.description_ring_loss_per_doubling
            if ring
            else rule.description_tree_loss_per_doubling
        )
    else:
        reach = max(2, fit.calibrated_nodes)
        c = rule.ring_loss_per_doubling if ring else rule.tree_loss_per_doubling
    return 1.0 / (1.0 + c * max(0.0, math.log2(num_nodes / reach)))
