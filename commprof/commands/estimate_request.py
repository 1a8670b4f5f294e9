"""One ``commprof estimate`` request: its fields declare the flags, one check what goes together.

:class:`EstimateRequest` is what is asked: what is predicted (a catalog model, a parameter file
or a trace), on which link (published, a cluster, a fits file, or calibrated on a dataset), the
what-if (cap, world size) and the step model's corrections. Each field declares its flag
(:class:`FlagSpec`, as ``commprof.matrix.FieldSpec`` declares ``run``'s): :func:`add_arguments`
makes the parser from them, :meth:`EstimateRequest.from_namespace` is the one reader of the
parsed options, and :meth:`EstimateRequest.validate` the one place that refuses flags that do not
go together, before anything is read or run. The modes take the request (``commands.estimate``,
``estimate_step``, ``estimate_trace``); the link is resolved once from it (``commands.links``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from commprof import flags
from commprof.modeling.collective.cost_model import ALGORITHMS
from commprof.modeling.collective.dataset_fits import FIT_SOURCES
from commprof.modeling.step.corrections import CORRECTION_NAMES, CORRECTIONS, Corrections
from commprof.modeling.step.idle import (
    DEFAULT_ALPHA_NS,
    DEFAULT_BATCH_TOKENS,
    DEFAULT_DEVICE_FLOPS_PER_S,
)

MAX_WORLD_SIZE = 1 << 20
"""Most ranks ``--world-size`` takes: about a million, past any data-parallel job."""
MAX_TFLOPS = 1e9
"""Most ``--device-tflops``: finite, a million times any device (a backward that vanishes, for
a what-if of communication alone)."""
MAX_BATCH_TOKENS = 1 << 40
"""Most ``--batch-tokens``: a trillion tokens a rank a step."""

SECTIONS: Final = {
    "what": "what to predict (one of)",
    "where": "where it runs",
    "link": "the link (--interconnect, --cluster or --fit; a trace keeps its own without one)",
    "idle": "the idle model's backward (without --fit DIR)",
    "step": "the step model (--fit DIR, a dataset folder)",
    "output": "output",
}
"""The help's sections, in order (:attr:`FlagSpec.section`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FlagSpec:
    """The flag of one request field; the parser derives from these (:func:`add_arguments`)."""

    help: str
    """What the flag asks, for ``--help``."""
    section: str
    """The help section it is listed in (:data:`SECTIONS`)."""
    metavar: str | None = None
    """The value's name in the help."""
    parse: Callable[[str], Any] | None = None
    """Parses and bounds the value (argparse's ``type``: ``commprof.flags``)."""
    choices: tuple[str, ...] | None = None
    """The values it takes."""
    action: str | type[argparse.Action] | None = None
    """argparse's action (``store_true``, ``append``, ``extend``)."""
    nargs: str | None = None
    """argparse's nargs (``+`` for a list)."""
    exclusive: str = ""
    """The set of flags it excludes (one of a set at most; the ``what`` set needs one)."""
    with_trace: bool = True
    """Applies with ``--trace`` (the trace gives the compute and communication timeline, so the
    model inputs and the step model's flags do not)."""


def _flag(default: Any = None, **spec: Any) -> Any:
    return field(default=default, metadata={"flag": FlagSpec(**spec)})


class _Given(argparse.Action):
    """Stores the flag's value and that it was given (``<dest>_given``): ``--bucket-cap-mb
    default`` asks ``--trace`` for DDP's default cap, where leaving the flag out asks for none."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimateRequest:
    """What ``commprof estimate`` is asked (every field is one flag; see :data:`SECTIONS`)."""

    model: str | None = _flag(
        metavar="NAME",
        help="a catalog model (or, with --fit DIR, one the dataset recorded)",
        section="what",
        exclusive="what",
    )
    params_file: str | None = _flag(
        metavar="FILE",
        help="YAML/JSON list of {name, numel, dtype_bytes}",
        section="what",
        exclusive="what",
    )
    trace: str | None = _flag(
        help="a rank trace or a folder of them (Kineto): replay its steps, then the what-if of "
        "--cluster/--interconnect and --world-size",
        section="what",
        metavar="DIR",
        exclusive="what",
    )
    world_size: int | None = _flag(
        metavar="N",
        help="ranks (>= 2); required, but with --trace the trace's own",
        section="where",
        parse=flags.bounded_int(MAX_WORLD_SIZE, unit="ranks"),
    )
    bucket_cap_mb: float | None = _flag(
        metavar="MIB",
        help="DDP cap (MiB, or 'default': DDP's own); with --trace, the cap to lay the trace's "
        "gradients out at",
        section="where",
        parse=flags.cap,
        action=_Given,
    )
    bucket_cap_mb_given: bool = False
    """Whether ``--bucket-cap-mb`` was given (set with it; no flag of its own)."""
    recommend_bucket_cap: bool = _flag(
        False,
        with_trace=False,
        help="search the cap that minimises exposed communication",
        section="where",
        action="store_true",
    )
    interconnect: str | None = _flag(
        metavar="NAME",
        help="published link name (see --interconnect-file)",
        section="link",
        exclusive="link",
    )
    interconnect_file: str | None = _flag(
        metavar="FILE", help="YAML file with extra links", section="link"
    )
    alpha_us: float | None = _flag(
        metavar="US",
        help=f"assumed latency for a published link (us; default {DEFAULT_ALPHA_NS / 1e3:g})",
        section="link",
        parse=float,
    )
    algorithm: str | None = _flag(
        help="cost model of a published link (ring)",
        section="link",
        choices=tuple(sorted(ALGORITHMS)),
    )
    cluster: str | None = _flag(
        help="a bundled cluster (commprof collective's) or a cluster YAML file: each all-reduce "
        "as NCCL would run it on --world-size GPUs of it, in place of one link",
        section="link",
        metavar="NAME|FILE",
        exclusive="link",
    )
    nccl_tests: tuple[str, ...] = _flag(
        (),
        help="with --cluster: all_reduce_perf logs of that cluster to calibrate the model on",
        section="link",
        metavar="LOG",
        nargs="+",
        action="extend",
    )
    run: str | None = _flag(
        help="with --nccl-tests: run K of each log, or 'all' runs (a file of several needs it)",
        section="link",
        metavar="K|all",
    )
    fit: str | None = _flag(
        metavar="DIR|FITS_JSON",
        with_trace=False,
        help="a dataset folder: the step model calibrated on a cell of --model; or a fits JSON "
        "(save_fits): the idle model on that ring fit",
        section="link",
    )
    fit_backend: str = _flag(
        "gloo",
        metavar="BACKEND",
        with_trace=False,
        help="backend of the fit to use",
        section="link",
    )
    fit_source: str = _flag(
        "microbench",
        with_trace=False,
        help="with --fit DATASET: fit the microbenchmark or the in-training bucket "
        "times (buckets: the idle model on that fit)",
        section="link",
        choices=FIT_SOURCES,
    )
    timeline: str | None = _flag(
        with_trace=False,
        help="take the backward timeline measured in a cell of this dataset (with --cell)",
        section="idle",
        metavar="RESULTS",
    )
    cell: str | None = _flag(
        metavar="ID",
        with_trace=False,
        help="cell id (or a unique prefix) for --timeline, or to calibrate --fit DIR on",
        section="idle",
    )
    batch_tokens: int | None = _flag(
        metavar="N",
        with_trace=False,
        help=f"tokens (or samples) per rank per step (default {DEFAULT_BATCH_TOKENS})",
        section="idle",
        parse=flags.bounded_int(MAX_BATCH_TOKENS),
    )
    device_tflops: float | None = _flag(
        metavar="TFLOPS",
        with_trace=False,
        help="sustained backward TFLOP/s of one device "
        f"(default {DEFAULT_DEVICE_FLOPS_PER_S / 1e12:g})",
        section="idle",
        parse=flags.bounded_float(MAX_TFLOPS, unit="TFLOP/s"),
    )
    same_host: bool = _flag(
        False,
        with_trace=False,
        help="with another --world-size: the ranks share the calibration's CPU host, so "
        "compute and gloo's transfers slow by the core share",
        section="step",
        action="store_true",
    )
    no_interference: bool = _flag(
        False,
        with_trace=False,
        help="leave the measured interference factors out (--without interference)",
        section="step",
        action="store_true",
    )
    without: tuple[str, ...] = _flag(
        (),
        with_trace=False,
        help="switch one correction off (repeatable): "
        + ", ".join(f"{c.name} ({c.scope.short})" for c in CORRECTIONS),
        section="step",
        action="append",
        choices=CORRECTION_NAMES,
        metavar="CORRECTION",
    )
    json: bool = _flag(
        False,
        help="one JSON document on stdout (docs/prediction.md)",
        section="output",
        action="store_true",
    )

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> EstimateRequest:
        """The request of parsed options (of :func:`add_arguments`): the one reader of them."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value: Any = getattr(args, f.name, f.default)
            if isinstance(f.default, tuple):
                value = tuple(value or ())
            values[f.name] = value
        return cls(**values)

    @property
    def mode(self) -> str:
        """``trace`` (``--trace``), ``step`` (``--fit`` a dataset folder with the microbenchmark
        fit) or ``idle`` (everything else: a published link, a cluster or a fit as the link)."""
        if self.trace is not None:
            return "trace"
        if self.fit and Path(self.fit).is_dir() and self.fit_source == "microbench":
            return "step"
        return "idle"

    @property
    def alpha_ns(self) -> float:
        """The latency assumed for a published link: ``--alpha-us``, else the default."""
        return DEFAULT_ALPHA_NS if self.alpha_us is None else self.alpha_us * 1e3

    @property
    def batch_tokens_used(self) -> int:
        """``--batch-tokens``, else the default."""
        return DEFAULT_BATCH_TOKENS if self.batch_tokens is None else int(self.batch_tokens)

    @property
    def device_flops_per_s(self) -> float:
        """``--device-tflops`` in FLOP/s, else the default."""
        tflops = self.device_tflops
        return DEFAULT_DEVICE_FLOPS_PER_S if tflops is None else float(tflops) * 1e12

    def corrections(self) -> Corrections:
        """``--without NAME`` (repeatable) and each correction's alias flags
        (``Correction.aliases``: ``--no-interference`` is ``--without interference``)."""
        names = list(self.without)
        for c in CORRECTIONS:
            names += [c.name for flag in c.aliases if getattr(self, flag[2:].replace("-", "_"))]
        return Corrections.without(names)

    def step_flags_given(self) -> list[str]:
        """The step model's flags that were given (``--same-host``, its corrections')."""
        given = {
            "--same-host": self.same_host,
            "--no-interference": self.no_interference,
            "--without": bool(self.without),
        }
        return [flag for flag, present in given.items() if present]

    def validate(self) -> None:
        """Refuse, naming the flags, what does not go together (the one such check).

        Raises:
            ValueError: one line naming the flags to leave out or to give.
        """
        from commprof.commands.estimate_checks import check

        check(self)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``commprof estimate``'s flags to a parser: one per :class:`EstimateRequest` field that
    declares one, in the help sections of :data:`SECTIONS`."""
    parser.usage = (
        "commprof estimate (--model NAME | --params-file FILE | --trace DIR) [--world-size N] "
        "[link] [options]"
    )
    parser.description = (
        "Predict DDP's gradient communication and its cost to the step. Three questions: the "
        "idle model (--model or --params-file on a link), the step model calibrated on a "
        "dataset (--fit DIR), and a trace's replay with its what-ifs (--trace). One result "
        "for each (--json: docs/prediction.md)."
    )
    groups = {key: parser.add_argument_group(title) for key, title in SECTIONS.items()}
    exclusive: dict[str, Any] = {}
    for f in dataclasses.fields(EstimateRequest):
        spec: FlagSpec | None = f.metadata.get("flag")
        if spec is None:
            continue
        target: Any = groups[spec.section]
        if spec.exclusive:
            if spec.exclusive not in exclusive:
                exclusive[spec.exclusive] = target.add_mutually_exclusive_group(
                    required=spec.exclusive == "what"
                )
            target = exclusive[spec.exclusive]
        kwargs: dict[str, Any] = {"help": spec.help, "dest": f.name}
        for key in ("metavar", "choices", "action", "nargs"):
            if getattr(spec, key) is not None:
                kwargs[key] = getattr(spec, key)
        if spec.parse is not None:
            kwargs["type"] = spec.parse
        if spec.action not in ("store_true", "append", "extend"):
            kwargs["default"] = f.default
        target.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    parser.set_defaults(bucket_cap_mb_given=False)
