"""The link of a ``commprof estimate`` request, resolved from its flags in one place.

``--interconnect NAME`` (with ``--interconnect-file``, ``--alpha-us`` and ``--algorithm``) is a
published link; ``--cluster NAME|FILE`` (with ``--nccl-tests``) a described cluster; a fit comes
from ``--fit``. Every mode of ``estimate`` builds its published link here, and the models take
whichever link as a :class:`~commprof.modeling.collective.link.Link`.
"""

from __future__ import annotations

import argparse

from commprof.modeling.collective.cost_model import LinkParams
from commprof.modeling.collective.interconnects import (
    Interconnect,
    get_interconnect,
    load_interconnects,
)


def published_link(args: argparse.Namespace, *, alpha_ns: float) -> tuple[LinkParams, Interconnect]:
    """The link of ``--interconnect`` (looked up in ``--interconnect-file`` or the bundled list).

    Args:
        args: Parsed ``commprof estimate`` options (``--interconnect`` given).
        alpha_ns: The latency it is assumed to have (``--alpha-us`` or the mode's default).

    Returns:
        The Hockney parameters under ``--algorithm`` (ring by default) and the published entry.
    """
    entry = get_interconnect(args.interconnect, load_interconnects(args.interconnect_file))
    params = LinkParams.from_bandwidth(
        bandwidth_bytes_per_s=entry.per_direction_bytes_per_s,
        alpha_ns=alpha_ns,
        algorithm=getattr(args, "algorithm", None) or "ring",
    )
    return params, entry
