"""Tests for commprof.training.models: parameter counts in closed form and real modules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.training import models
from commprof.training.models import (
    GPT,
    MODEL_NAMES,
    GPTConfig,
    build_model,
    count_parameters,
    parameter_sizes,
    solve_srn_geometry,
    srn_num_parameters,
)

SRN_TARGETS = {
    "srn-100k": 100_000,
    "srn-1m": 1_000_000,
    "srn-10m": 10_000_000,
    "srn-50m": 50_000_000,
    "srn-150m": 150_000_000,
    "srn-400m": 400_000_000,
}
# Small enough to allocate in a test (largest: srn-10m, 40 MB of fp32 weights).
ALLOCATABLE = ("srn-100k", "srn-1m", "srn-10m", "resnet18")


def _real_sizes(module: torch.nn.Module) -> list[tuple[str, int]]:
    return [(name, p.numel()) for name, p in module.named_parameters()]


def test_model_names_cover_design_names() -> None:
    design = {"srn-1m", "srn-10m", "srn-50m", "srn-150m", "srn-400m", "resnet18", "gpt2-small"}
    assert design <= set(MODEL_NAMES)


@pytest.mark.parametrize(("name", "target"), sorted(SRN_TARGETS.items()))
def test_srn_hits_target_within_half_percent(name: str, target: int) -> None:
    count = count_parameters(name)
    assert abs(count - target) <= 0.005 * target
    g = models.model_spec(name).geometry
    assert isinstance(g, models.SRNGeometry)
    # The closed form, spelled out term by term.
    w, h, d = g.width, g.hidden, g.depth
    assert count == (256 * w + w) + d * (2 * w + (w * h + h) + (h * w + w)) + 2 * w + (10 * w + 10)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=10_000, max_value=5_000_000_000))
def test_srn_solver_within_half_percent_for_any_target(target: int) -> None:
    g = solve_srn_geometry(target)
    assert abs(srn_num_parameters(g.width, g.hidden, g.depth) - target) <= 0.005 * target
    # Hidden stays near the 4x ratio the bisection started from.
    assert 4 * g.width <= g.hidden <= 5 * g.width


def test_srn_solver_rejects_tiny_target() -> None:
    with pytest.raises(ValueError, match="at least 10000"):
        solve_srn_geometry(9_999)


def test_resnet18_count_is_torchvisions() -> None:
    stem = 64 * 3 * 7 * 7 + 2 * 64
    layer1 = 2 * 2 * (64 * 64 * 9 + 2 * 64)
    layer2 = (128 * 64 * 9 + 128 * 128 * 9 + 128 * 64 + 3 * 2 * 128) + 2 * (128 * 128 * 9 + 256)
    layer3 = (256 * 128 * 9 + 256 * 256 * 9 + 256 * 128 + 3 * 2 * 256) + 2 * (256 * 256 * 9 + 512)
    layer4 = (512 * 256 * 9 + 512 * 512 * 9 + 512 * 256 + 3 * 2 * 512) + 2 * (512 * 512 * 9 + 1024)
    fc = 512 * 1000 + 1000
    assert stem + layer1 + layer2 + layer3 + layer4 + fc == 11_689_512
    assert count_parameters("resnet18") == 11_689_512


def test_gpt2_small_count_is_124_439_808() -> None:
    c, v, t = 768, 50257, 1024
    block = (
        2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c)
    )
    expected = v * c + t * c + 12 * block + 2 * c  # lm_head is tied to wte: counted once
    assert expected == 124_439_808
    assert count_parameters("gpt2-small") == 124_439_808


@pytest.mark.parametrize("name", ALLOCATABLE)
def test_analytic_sizes_equal_real_module(name: str) -> None:
    module = build_model(name)
    assert _real_sizes(module) == parameter_sizes(name)
    assert sum(p.numel() for p in module.parameters()) == count_parameters(name)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_analytic_sizes_equal_meta_module(name: str) -> None:
    # The meta device builds the full structure without allocating storage,
    # so this covers srn-400m and gpt2-small at no memory cost.
    module = build_model(name, device="meta")
    assert all(p.is_meta for p in module.parameters())
    assert _real_sizes(module) == parameter_sizes(name)
    assert sum(p.numel() for p in module.parameters()) == count_parameters(name)


def test_gpt2_small_ties_lm_head_and_shapes() -> None:
    module = build_model("gpt2-small", device="meta")
    assert isinstance(module, GPT)
    assert module.lm_head.weight is module.transformer.wte.weight
    assert tuple(module.transformer.wpe.weight.shape) == (1024, 768)
    logits = module(torch.zeros(2, 16, dtype=torch.long, device="meta"))
    assert tuple(logits.shape) == (2, 16, 50257)


def test_tiny_gpt_forward_backward_and_count() -> None:
    cfg = GPTConfig(block_size=16, vocab_size=97, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    module = GPT(cfg)
    expected = 97 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
    assert sum(p.numel() for p in module.parameters()) == expected
    assert _real_sizes(module) == models.gpt_parameter_sizes(cfg)
    idx = torch.randint(0, 97, (3, 16))
    logits = module(idx)
    assert logits.shape == (3, 16, 97)
    logits.sum().backward()
    assert module.lm_head.weight.grad is not None
    with pytest.raises(ValueError, match="block_size=16"):
        module(torch.zeros(1, 17, dtype=torch.long))


def test_small_models_forward() -> None:
    srn = build_model("srn-100k")
    assert srn(torch.zeros(4, 256)).shape == (4, 10)
    resnet = build_model("resnet18").eval()
    with torch.no_grad():
        assert resnet(torch.zeros(2, 3, 32, 32)).shape == (2, 1000)


def test_generic_srn_name_and_unknown_name() -> None:
    assert abs(count_parameters("srn-250k") - 250_000) <= 0.005 * 250_000
    with pytest.raises(ValueError, match="resnet18") as info:
        build_model("resnet50")
    for name in MODEL_NAMES:
        assert name in str(info.value)


def test_geometry_validation() -> None:
    with pytest.raises(ValueError, match="n_embd=10"):
        GPTConfig(n_embd=10, n_head=3)
    with pytest.raises(ValueError, match="width=0"):
        models.SRNGeometry(width=0, hidden=4, depth=1)
    with pytest.raises(ValueError, match="layers"):
        models.ResNetGeometry(layers=(2, 2, 2))  # type: ignore[arg-type]
