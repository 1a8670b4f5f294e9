"""Which flags of a ``commprof estimate`` request go together: the checks of
:meth:`~commprof.commands.estimate_request.EstimateRequest.validate`, in one place.

Each mode refuses, in one line naming the flags, what it would ignore or cannot take: ``--trace``
the model inputs and the step model's flags (those declared ``with_trace=False``); a cluster a
published link's flags and a fitted link; the step model (``--fit DIR``) the idle model's
backward; the idle model the step model's corrections. Nothing is read or run before they pass.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from commprof.commands.estimate_request import EstimateRequest


def check(r: EstimateRequest) -> None:
    """Every check of a request, in its mode.

    Raises:
        ValueError: one line naming the flags to leave out or to give.
    """
    if r.mode == "trace":
        _check_trace(r)
        return
    if r.world_size is None:
        raise ValueError("--world-size N is required with --model or --params-file")
    _check_cluster(r)
    if r.mode == "step":
        _check_step(r)
    else:
        _check_idle(r)


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _refuse(given: dict[str, bool], why: str) -> None:
    bad = [flag for flag, present in given.items() if present]
    if bad:
        raise ValueError(f"{', '.join(bad)} do(es) not apply {why}; leave them out")


def not_with_trace(r: EstimateRequest) -> list[str]:
    """The flags given that do not apply with ``--trace`` (``FlagSpec.with_trace`` false)."""
    return [
        _flag_name(f.name)
        for f in dataclasses.fields(r)
        if "flag" in f.metadata
        and not f.metadata["flag"].with_trace
        and getattr(r, f.name) != f.default
    ]


def _check_trace(r: EstimateRequest) -> None:
    """``--trace``: the model inputs and the step model's flags do not apply; a published link's
    flags need ``--interconnect``, ``--nccl-tests`` needs ``--cluster``, ``--world-size`` a link."""
    bad = not_with_trace(r)
    if bad:
        raise ValueError(
            f"{', '.join(bad)} do(es) not apply with --trace (the trace gives the compute and "
            "communication timeline); leave them out"
        )
    link_flags = {
        "--alpha-us": r.alpha_us is not None,
        "--algorithm": r.algorithm is not None,
        "--interconnect-file": r.interconnect_file is not None,
    }
    named = ", ".join(f for f, given in link_flags.items() if given)
    if r.cluster and named:
        raise ValueError(f"--cluster {r.cluster}: {named} apply to --interconnect, not a cluster")
    if named and not r.interconnect:
        raise ValueError(f"{named} describe a published link: give --interconnect NAME too")
    if (r.nccl_tests or r.run) and not r.cluster:
        raise ValueError("--nccl-tests LOG calibrates a cluster: give --cluster NAME|FILE")
    if r.world_size is not None and not (r.cluster or r.interconnect):
        raise ValueError(
            f"--world-size {r.world_size} with --trace: give --cluster NAME|FILE or "
            "--interconnect NAME, the collective model that predicts the new all-reduces"
        )


def _check_cluster(r: EstimateRequest) -> None:
    """``--nccl-tests`` and ``--run`` need ``--cluster``; with it, a published link's flags, a
    fits JSON or the bucket-time fit as the link, and ``--same-host`` (a cluster's ranks have
    GPUs of their own) do not apply."""
    if not r.cluster:
        if r.nccl_tests or r.run:
            raise ValueError("--nccl-tests LOG calibrates a cluster: give --cluster NAME|FILE")
        return
    given = {
        "--interconnect-file": r.interconnect_file is not None,
        "--alpha-us": r.alpha_us is not None,
        "--algorithm": r.algorithm is not None,
        "--fit FITS_JSON (a fitted link)": bool(r.fit and not Path(r.fit).is_dir()),
        "--fit-source buckets (a fitted link)": bool(r.fit) and r.fit_source != "microbench",
        "--same-host": r.same_host,
    }
    bad = [flag for flag, present in given.items() if present]
    if bad:
        raise ValueError(
            f"--cluster {r.cluster}: {', '.join(bad)} do(es) not apply to a cluster (its "
            "collective model sets the link, latency and algorithm); leave them out"
        )


def _check_step(r: EstimateRequest) -> None:
    """``--fit DIR``: the step model replays the calibration cells' measured timeline on ring
    all-reduces; its link is the dataset's fit, a published one or a cluster."""
    _refuse(
        {
            "--batch-tokens": r.batch_tokens is not None,
            "--device-tflops": r.device_tflops is not None,
            "--timeline": r.timeline is not None,
            "--algorithm": r.algorithm is not None,
        },
        f"to --fit {r.fit} (the step simulator replays the calibration cells' measured "
        "timeline, ring all-reduces)",
    )
    _refuse(
        {
            "--alpha-us": r.alpha_us is not None and not r.interconnect,
            "--interconnect-file": r.interconnect_file is not None and not r.interconnect,
        },
        "without --interconnect (they describe a published link)",
    )
    if not r.model and not r.cell:
        raise ValueError("--fit DIR with --params-file needs --cell ID (the calibration cell)")


def _check_idle(r: EstimateRequest) -> None:
    """The idle model: not the step model's flags, nor those of a link or a backward timeline
    it does not have; one link; ``--timeline`` with ``--cell``."""
    _refuse(
        {flag: True for flag in r.step_flags_given()},
        "here: they switch parts of the step simulator, which only --fit DIR with the "
        "microbenchmark fit (--fit-source microbench, the default) runs",
    )
    fitted = bool(r.fit)
    _refuse(
        {
            "--alpha-us": r.alpha_us is not None and fitted,
            "--algorithm": r.algorithm is not None and fitted,
            "--interconnect": bool(r.interconnect) and fitted,
            "--interconnect-file": r.interconnect_file is not None and fitted,
        },
        f"to --fit {r.fit} (the fit is the link, a ring with its own latency)",
    )
    _refuse(
        {
            "--fit-backend": r.fit_backend != "gloo" and not fitted,
            "--fit-source": r.fit_source != "microbench" and not fitted,
        },
        "without --fit (they choose which fit of a dataset or fits JSON is the link)",
    )
    _refuse(
        {
            "--batch-tokens": r.batch_tokens is not None and r.timeline is not None,
            "--device-tflops": r.device_tflops is not None and r.timeline is not None,
        },
        "to --timeline (the backward timeline is measured)",
    )
    if not (r.cluster or r.fit or r.interconnect):
        raise ValueError("give --interconnect NAME, --cluster NAME|FILE or --fit FITS_JSON")
    if (r.timeline or r.cell) and not (r.timeline and r.cell):
        raise ValueError("--timeline RESULTS and --cell ID go together")
