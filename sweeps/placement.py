"""Can a gang ever be placed on this cluster? Arithmetic on the nodes' total resources.

A placement group of ``world_size`` equal bundles fits an empty cluster when (Ray's placement
strategies, docs.ray.io "Placement Groups"):

- ``STRICT_PACK``: one node holds every bundle;
- ``STRICT_SPREAD``: ``world_size`` different nodes hold one bundle each;
- ``PACK`` and ``SPREAD`` (best effort): the nodes together hold ``world_size`` bundles, each
  bundle on one node.

The driver rejects a cell as "cannot be placed" only where this says no: a cluster that is
merely busy (other drivers, other jobs) makes the cell wait for free resources instead. Plain
data in and out: no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def bundles_on(node: Mapping[str, float], bundle: Mapping[str, float]) -> int:
    """How many copies of ``bundle`` one node's resources hold."""
    counts = [
        math.floor(node.get(key, 0.0) / amount + 1e-9) for key, amount in bundle.items() if amount
    ]
    return min(counts, default=0)


def fits(
    nodes: Sequence[Mapping[str, float]],
    bundle: Mapping[str, float],
    world_size: int,
    strategy: str,
) -> bool:
    """Whether ``world_size`` bundles fit the nodes' total resources under ``strategy``.

    Args:
        nodes: each alive node's total resources (``ray.nodes()[i]["Resources"]``).
        bundle: one rank's resources (``commprof.actors.gang.bundle_for``).
        world_size: ranks in the gang.
        strategy: a Ray placement strategy (``commprof.matrix.PLACEMENTS``).

    Returns:
        True where an empty cluster of these nodes could place the gang.
    """
    per_node = [bundles_on(node, bundle) for node in nodes]
    if strategy == "STRICT_PACK":
        return max(per_node, default=0) >= world_size
    if strategy == "STRICT_SPREAD":
        return sum(1 for n in per_node if n >= 1) >= world_size
    if strategy in ("PACK", "SPREAD"):
        return sum(per_node) >= world_size
    raise ValueError(f"placement {strategy!r} is not a Ray placement strategy")


def describe(nodes: Sequence[Mapping[str, float]], bundle: Mapping[str, float]) -> str:
    """The nodes' capacity in bundles, for an error message (``2 nodes that hold 4 + 1``)."""
    counts = [bundles_on(node, bundle) for node in nodes]
    if not counts:
        return "no alive node"
    if len(counts) == 1:
        return f"1 node that holds {counts[0]}"
    return f"{len(counts)} nodes that hold {' + '.join(map(str, counts))}"
