"""The link of a ``commprof estimate`` request, resolved once from it (:func:`resolve_link`).

``--interconnect NAME`` (with ``--interconnect-file``, ``--alpha-us`` and ``--algorithm``) is a
published link; ``--cluster NAME|FILE`` (with ``--nccl-tests`` and ``--run``) a described
cluster; ``--fit`` a ring fit (a fits JSON, or a dataset's bucket-time fit) for the idle model.
Without one, the step model keeps the link calibrated on its dataset and a trace its measured
collectives. Every mode takes the result as a :class:`~commprof.modeling.collective.link.Link`
with its label and where it came from.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from commprof.commands.estimate_request import EstimateRequest
from commprof.modeling.collective.cluster_link import cluster_link
from commprof.modeling.collective.cost_model import LinkParams
from commprof.modeling.collective.dataset_fits import fits_from_dataset, load_fits
from commprof.modeling.collective.interconnects import get_interconnect, load_interconnects
from commprof.modeling.collective.link import Link


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedLink:
    """The link a request asks for, and how to say where it came from."""

    link: Link | None
    """The link; None where the request names none (the step model's calibrated fit, a trace's
    measured collectives)."""
    label: str | None
    """The link in words, for output (None with no link)."""
    source: str
    """The flag or file it came from (``--cluster NAME``, ``--interconnect NAME``, ``fit from
    PATH``)."""
    latency_ns: float | None = None
    """The latency assumed for a published link (None where the link's model sets it)."""
    latency_source: str = ""
    """Where :attr:`latency_ns` came from (``--alpha-us`` or the built-in default)."""


NO_LINK = ResolvedLink(link=None, label=None, source="")
"""A request that names no link."""


def published_link(request: EstimateRequest) -> ResolvedLink:
    """The link of ``--interconnect`` (looked up in ``--interconnect-file`` or the bundled list),
    under ``--algorithm`` (ring by default) with the latency ``--alpha-us`` or the default."""
    known = load_interconnects(request.interconnect_file)
    entry = get_interconnect(request.interconnect or "", known)
    params = LinkParams.from_bandwidth(
        bandwidth_bytes_per_s=entry.per_direction_bytes_per_s,
        alpha_ns=request.alpha_ns,
        algorithm=request.algorithm or "ring",
    )
    source = f"--interconnect {request.interconnect}" + (
        f" (--interconnect-file {request.interconnect_file})" if request.interconnect_file else ""
    )
    return ResolvedLink(
        link=params,
        label=(
            f"{entry.name} ({entry.per_direction_bytes_per_s / 1e9:.1f} GB/s a direction, "
            f"alpha {params.alpha_ns / 1e3:g} us assumed, {params.algorithm})"
        ),
        source=source,
        latency_ns=params.alpha_ns,
        latency_source=(
            "--alpha-us" if request.alpha_us is not None else "built-in default; --alpha-us sets it"
        ),
    )


def fitted_link(request: EstimateRequest, world_size: int) -> ResolvedLink:
    """The idle model's link of ``--fit``: the ``--fit-backend`` fit at ``world_size`` of a fits
    JSON (``save_fits``) or of a dataset (its ``--fit-source`` times).

    Raises:
        ValueError: naming ``--fit``: not a dataset or fits JSON, or no fit at that world size.
    """
    path = str(request.fit)
    if Path(path).is_dir():
        fits = fits_from_dataset(path, source=request.fit_source)
    else:
        try:
            fits = load_fits(path)
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"--fit {path}: neither a dataset folder nor a fits JSON (save_fits) "
                f"({str(err)[:200]})"
            ) from None
    matches = {k: f for k, f in fits.items() if k[0] == request.fit_backend}
    for (backend, regime, ws), fit in matches.items():
        if ws == world_size:
            return ResolvedLink(
                link=fit,
                label=f"fit {backend}/{regime}/p={ws} ({fit.method})",
                source=f"fit from {path}",
                latency_source=f"fit from {path} (alpha of the fit)",
            )
    valid = sorted({k[2] for k in matches})
    raise ValueError(
        f"no {request.fit_backend} fit for world size {world_size} in {path}; "
        f"fitted world sizes: {valid}"
    )


def resolve_link(request: EstimateRequest, world_size: int | None) -> ResolvedLink:
    """The one link of a validated request at ``world_size`` ranks (None: a trace's own, not
    known; only a request with no link may leave it out).

    Raises:
        ValueError: naming the flag: an unknown link or cluster, a world size that does not fit
            the cluster, a log that does not read, a fit that is not there.
    """
    if request.cluster:
        if world_size is None:
            raise ValueError("the trace does not say its world size: give --world-size N")
        link = cluster_link(request.cluster, world_size, request.nccl_tests, request.run)
        for note in link.log_notes:
            print(f"commprof estimate: {note}", file=sys.stderr)
        return ResolvedLink(
            link=link,
            label=link.describe(world_size),
            source=f"--cluster {request.cluster}",
            latency_source=f"--cluster {request.cluster} (its collective model)",
        )
    if request.interconnect:
        return published_link(request)
    if request.fit and request.mode == "idle":
        if world_size is None:
            raise ValueError("--world-size N is required with --model or --params-file")
        return fitted_link(request, world_size)
    return NO_LINK
