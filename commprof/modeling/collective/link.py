"""The link: what every all-reduce time model offers the models that use one.

A link predicts the all-reduce time of a message at a world size. Three kinds implement
:class:`Link`: a published link's Hockney parameters
(:class:`~commprof.modeling.collective.cost_model.LinkParams`, the algorithm it names), a ring
fit on measured times (:data:`~commprof.modeling.collective.ring_fit.Fit`: ``RingFit`` or
``PiecewiseFit``) and a described cluster under NCCL's own tuning model
(:class:`~commprof.modeling.collective.cluster_link.ClusterLink`). The idle model, the step
model and the trace what-if take any of them and ask only this protocol, so a new kind of link
is one class with these four members. ``commprof estimate`` resolves the one link of a request
from its flags (:mod:`commprof.commands`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt


class Link(Protocol):
    """An all-reduce time model of one link or cluster."""

    def predict_ns(self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike) -> np.ndarray:
        """Predicted all-reduce time (ns, float64) of each size at each world size (broadcast)."""
        ...

    def label(self, world_size: int) -> str:
        """One line for output: what the link is, at ``world_size`` ranks."""
        ...

    def interval(self) -> tuple[Link, Link] | None:
        """The link at the low and high ends of its calibration's interval (the step model's
        range carries them through); None where it has none (a published link)."""
        ...

    @property
    def backend(self) -> str | None:
        """The communication backend whose times the link predicts (``"nccl"`` for a cluster);
        None where that is the calibration's own (a published link, a fit)."""
        ...
