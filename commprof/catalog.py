"""The models commprof can build, as names, geometry and closed-form parameter sizes.

No torch here: ``commprof.training.models`` builds the modules; the matrix, the CLI, the
memory guard and ``estimate`` resolve names and count parameters here, so they start fast on
a machine with only a results folder. Tests check this arithmetic against real modules.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

SRN_NAMES = ("srn-100k", "srn-1m", "srn-10m", "srn-50m", "srn-150m", "srn-400m")
"""ScalableResidualNet sizes (parameter-count targets)."""

REFERENCE_NAMES = ("resnet18", "gpt2-small")
"""Reference models with published parameter counts."""

MODEL_NAMES = SRN_NAMES + REFERENCE_NAMES
"""Every name ``commprof.training.models.build_model`` accepts."""

_SRN_NAME = re.compile(r"^srn-([1-9][0-9]*)([km])$")


SRN_INPUT_DIM = 256
"""Input features of every ScalableResidualNet (synthetic data draws this many)."""
SRN_NUM_CLASSES = 10
"""Output classes of every ScalableResidualNet."""
SRN_HIDDEN_RATIO = 4
"""The solver's starting hidden/width ratio of a residual block (as in transformer MLPs)."""
SRN_MAX_RELATIVE_ERROR = 0.005
"""The solver guarantees |count - target| <= 0.5 % of the target."""
SRN_MIN_TARGET = 10_000
"""Smallest parameter target the solver accepts."""


# ---------------------------------------------------------------------------------------
# Geometry and closed-form parameter counts (plain integers, no tensors).


@dataclass(frozen=True, kw_only=True, slots=True)
class SRNGeometry:
    """Shape of a ScalableResidualNet."""

    width: int
    """Residual stream width."""
    hidden: int
    """Hidden units of each block's MLP."""
    depth: int
    """Number of residual blocks."""
    input_dim: int = SRN_INPUT_DIM
    """Input features."""
    num_classes: int = SRN_NUM_CLASSES
    """Output classes."""

    def __post_init__(self) -> None:
        for field in ("width", "hidden", "depth", "input_dim", "num_classes"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SRNGeometry.{field}={value!r}: must be a positive int")


@dataclass(frozen=True, kw_only=True, slots=True)
class ResNetGeometry:
    """Shape of a torchvision-style ResNet with BasicBlocks (defaults: ResNet-18)."""

    num_classes: int = 1000
    """Classifier outputs (ImageNet: 1000)."""
    in_channels: int = 3
    """Image channels."""
    layers: tuple[int, int, int, int] = (2, 2, 2, 2)
    """BasicBlocks per stage (ResNet-18: 2, 2, 2, 2; ResNet-34: 3, 4, 6, 3)."""

    def __post_init__(self) -> None:
        if self.num_classes < 1 or self.in_channels < 1:
            raise ValueError(
                f"ResNetGeometry: num_classes={self.num_classes!r} and "
                f"in_channels={self.in_channels!r} must be positive"
            )
        if len(self.layers) != 4 or any(n < 1 for n in self.layers):
            raise ValueError(f"ResNetGeometry.layers={self.layers!r}: need 4 positive ints")


@dataclass(frozen=True, kw_only=True, slots=True)
class GPTConfig:
    """nanoGPT's GPTConfig; the defaults are GPT-2 small (124,439,808 parameters)."""

    block_size: int = 1024
    """Context length (rows of the positional embedding)."""
    vocab_size: int = 50257
    """Vocabulary size (GPT-2's BPE: 50257)."""
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads."""
    n_embd: int = 768
    """Model width."""
    dropout: float = 0.0
    """Dropout probability (0: deterministic steps)."""
    bias: bool = True
    """Biases in Linear and LayerNorm layers (GPT-2: True)."""

    def __post_init__(self) -> None:
        for field in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{field}={value!r}: must be a positive int")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd={self.n_embd} is not divisible by n_head={self.n_head}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout={self.dropout!r}: must be in [0, 1)")


def _linear(prefix: str, n_in: int, n_out: int, bias: bool = True) -> list[tuple[str, int]]:
    sizes = [(f"{prefix}.weight", n_out * n_in)]
    return [*sizes, (f"{prefix}.bias", n_out)] if bias else sizes


def _norm(prefix: str, n: int, bias: bool = True) -> list[tuple[str, int]]:
    sizes = [(f"{prefix}.weight", n)]
    return [*sizes, (f"{prefix}.bias", n)] if bias else sizes


def srn_parameter_sizes(g: SRNGeometry) -> list[tuple[str, int]]:
    """(name, numel) of a ScalableResidualNet in registration order."""
    sizes = _linear("input_proj", g.input_dim, g.width)
    for i in range(g.depth):
        sizes += _norm(f"blocks.{i}.norm", g.width)
        sizes += _linear(f"blocks.{i}.fc1", g.width, g.hidden)
        sizes += _linear(f"blocks.{i}.fc2", g.hidden, g.width)
    return sizes + _norm("norm", g.width) + _linear("head", g.width, g.num_classes)


def srn_num_parameters(width: int, hidden: int, depth: int) -> int:
    """Closed form: (in+1) w + depth (2 w h + h + 3 w) + 2 w + (w+1) classes.

    Terms: input projection; per block LayerNorm (2w), fc1 (wh+h), fc2 (hw+w);
    final LayerNorm; head.
    """
    w, h, c = width, hidden, SRN_NUM_CLASSES
    return (SRN_INPUT_DIM + 1) * w + depth * (2 * w * h + h + 3 * w) + 2 * w + (w + 1) * c


def srn_depth_for_target(target: int) -> int:
    """Depth rule: grows slowly with size, ``max(2, 2 round(log10 target) - 8)``.

    100k -> 2, 1M -> 4, 10M -> 6, 50M and 150M -> 8, 400M -> 10.
    """
    return max(2, 2 * round(math.log10(target)) - 8)


def solve_srn_geometry(target: int) -> SRNGeometry:
    """Geometry whose parameter count is within 0.5 % of ``target``.

    Bisection on width (integer) for the largest ``w`` whose count with
    ``hidden = 4 w`` does not exceed the target, at the depth of
    :func:`srn_depth_for_target`; then the hidden size is rounded to close the
    remaining gap, since a unit of width alone moves the count by about 2/w of it.
    The leftover error is at most ``depth (2w + 1) / 2`` parameters.

    Args:
        target: Parameter count to hit, at least :data:`SRN_MIN_TARGET`.

    Returns:
        The geometry.

    Raises:
        ValueError: Target too small.
    """
    if target < SRN_MIN_TARGET:
        raise ValueError(f"SRN target={target}: must be at least {SRN_MIN_TARGET} parameters")
    depth = srn_depth_for_target(target)

    def count(w: int) -> int:
        return srn_num_parameters(w, SRN_HIDDEN_RATIO * w, depth)

    lo, hi = 1, 2  # invariant: count(lo) <= target < count(hi)
    while count(hi) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) <= target else (lo, mid)
    width = lo
    per_hidden_unit = depth * (2 * width + 1)
    hidden = round((target - srn_num_parameters(width, 0, depth)) / per_hidden_unit)
    geometry = SRNGeometry(width=width, hidden=hidden, depth=depth)
    error = abs(srn_num_parameters(width, hidden, depth) - target)
    assert error <= SRN_MAX_RELATIVE_ERROR * target, (target, geometry, error)
    return geometry


def resnet_parameter_sizes(g: ResNetGeometry) -> list[tuple[str, int]]:
    """(name, numel) of a torchvision-style BasicBlock ResNet in registration order.

    Convolutions have no bias; each BatchNorm has weight and bias (its running
    statistics are buffers, not parameters).
    """
    sizes = [("conv1.weight", 64 * g.in_channels * 7 * 7), *_norm("bn1", 64)]
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), g.layers, strict=True)):
        for j in range(blocks):
            p = f"layer{stage + 1}.{j}"
            cin = inplanes if j == 0 else planes
            sizes += [(f"{p}.conv1.weight", planes * cin * 9), *_norm(f"{p}.bn1", planes)]
            sizes += [(f"{p}.conv2.weight", planes * planes * 9), *_norm(f"{p}.bn2", planes)]
            if j == 0 and (stage > 0 or inplanes != planes):
                sizes += [(f"{p}.downsample.0.weight", planes * cin)]
                sizes += _norm(f"{p}.downsample.1", planes)
        inplanes = planes
    return sizes + _linear("fc", 512, g.num_classes)


def gpt_parameter_sizes(cfg: GPTConfig) -> list[tuple[str, int]]:
    """(name, numel) of the GPT in registration order; the tied lm_head appears once.

    GPT-2 small: wte 50257*768 + wpe 1024*768 + 12 blocks of
    (2*2*768 + 768*2304 + 2304 + 768*768 + 768 + 768*3072 + 3072 + 3072*768 + 768)
    + ln_f 2*768 = 124,439,808.
    """
    c, b = cfg.n_embd, cfg.bias
    sizes = [("transformer.wte.weight", cfg.vocab_size * c)]
    sizes += [("transformer.wpe.weight", cfg.block_size * c)]
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}"
        sizes += _norm(f"{p}.ln_1", c, b)
        sizes += _linear(f"{p}.attn.c_attn", c, 3 * c, b) + _linear(f"{p}.attn.c_proj", c, c, b)
        sizes += _norm(f"{p}.ln_2", c, b)
        sizes += _linear(f"{p}.mlp.c_fc", c, 4 * c, b) + _linear(f"{p}.mlp.c_proj", 4 * c, c, b)
    return sizes + _norm("transformer.ln_f", c, b)


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """What a model name resolves to."""

    name: str
    """The model name, e.g. ``srn-10m``."""
    family: str
    """``srn``, ``resnet`` or ``gpt``."""
    geometry: SRNGeometry | ResNetGeometry | GPTConfig
    """Family-specific shape of the network."""
    target_num_parameters: int | None
    """The parameter count the SRN solver aimed for; None for fixed architectures."""

    def __post_init__(self) -> None:
        expected = {"srn": SRNGeometry, "resnet": ResNetGeometry, "gpt": GPTConfig}
        if self.family not in expected:
            raise ValueError(f"family={self.family!r}: use one of {sorted(expected)}")
        if not isinstance(self.geometry, expected[self.family]):
            raise TypeError(
                f"geometry={self.geometry!r} does not fit family={self.family!r}: "
                f"pass a {expected[self.family].__name__}"
            )

    @property
    def num_parameters(self) -> int:
        """Unique parameters (tied weights counted once), in closed form."""
        return sum(n for _, n in self.parameter_sizes())

    def parameter_sizes(self) -> list[tuple[str, int]]:
        """(name, numel) of every unique parameter in registration order."""
        g = self.geometry
        if isinstance(g, SRNGeometry):
            return srn_parameter_sizes(g)
        if isinstance(g, ResNetGeometry):
            return resnet_parameter_sizes(g)
        return gpt_parameter_sizes(g)


@functools.lru_cache(maxsize=64)
def model_spec(name: str) -> ModelSpec:
    """Resolve a model name to its spec, without allocating anything.

    Args:
        name: A name from :data:`MODEL_NAMES` or ``srn-<N>k`` / ``srn-<N>m``.

    Returns:
        The :class:`ModelSpec`.

    Raises:
        ValueError: Unknown name (the message lists the valid ones).
    """
    if name == "resnet18":
        return ModelSpec(
            name=name, family="resnet", geometry=ResNetGeometry(), target_num_parameters=None
        )
    if name == "gpt2-small":
        return ModelSpec(name=name, family="gpt", geometry=GPTConfig(), target_num_parameters=None)
    match = _SRN_NAME.match(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"unknown model name {name!r}: use one of {', '.join(MODEL_NAMES)} "
            "(or srn-<N>k / srn-<N>m for another residual-MLP size)"
        )
    target = int(match.group(1)) * (1_000 if match.group(2) == "k" else 1_000_000)
    return ModelSpec(
        name=name,
        family="srn",
        geometry=solve_srn_geometry(target),
        target_num_parameters=target,
    )


def is_model_name(name: str) -> bool:
    """Whether the catalog builds ``name`` (:func:`model_spec` is the one rule)."""
    try:
        model_spec(name)
    except ValueError:
        return False
    return True


def count_parameters(name: str) -> int:
    """Number of unique parameters of model ``name``, by arithmetic (no allocation)."""
    return model_spec(name).num_parameters


def parameter_sizes(name: str) -> list[tuple[str, int]]:
    """(parameter name, numel) in registration order, as ``model.named_parameters()``.

    Tied weights appear once, under their first name (as DDP sees them).
    """
    return model_spec(name).parameter_sizes()
