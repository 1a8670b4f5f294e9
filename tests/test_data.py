"""Tests for commprof.training.data: deterministic synthetic batches and losses."""

from __future__ import annotations

import math

import pytest
import torch

from commprof.training.data import (
    GPT_SEQ_LEN,
    batch_seed,
    loss_fn,
    make_batch,
)
from commprof.training.models import GPT, GPTConfig, build_model


def test_same_triple_gives_identical_batch() -> None:
    a = make_batch("srn-100k", 8, rank=1, seed=7, step=3)
    b = make_batch("srn-100k", 8, rank=1, seed=7, step=3)
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("change", [{"rank": 2}, {"seed": 8}, {"step": 4}])
def test_changing_rank_seed_or_step_changes_batch(change: dict[str, int]) -> None:
    args = {"rank": 1, "seed": 7, "step": 3}
    x0, _ = make_batch("srn-100k", 8, rank=args["rank"], seed=args["seed"], step=args["step"])
    args.update(change)
    x1, _ = make_batch("srn-100k", 8, rank=args["rank"], seed=args["seed"], step=args["step"])
    assert not torch.equal(x0, x1)


def test_batch_seed_distinguishes_permuted_triples() -> None:
    seeds = {batch_seed(s, r, t) for s in range(4) for r in range(4) for t in range(4)}
    assert len(seeds) == 4 * 4 * 4
    assert all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(ValueError, match="rank=-1"):
        batch_seed(0, -1, 0)


def test_srn_shapes_and_ranges() -> None:
    x, y = make_batch("srn-1m", 16, rank=0, seed=0, step=0)
    assert x.shape == (16, 256) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64
    assert int(y.min()) >= 0 and int(y.max()) < 10


def test_resnet_shapes_default_and_small_image() -> None:
    x, y = make_batch("resnet18", 2, rank=0, seed=0, step=0)
    assert x.shape == (2, 3, 224, 224)
    assert y.shape == (2,) and int(y.max()) < 1000
    small, _ = make_batch("resnet18", 2, rank=0, seed=0, step=0, image_size=32)
    assert small.shape == (2, 3, 32, 32)
    with pytest.raises(ValueError, match="image_size=8"):
        make_batch("resnet18", 2, rank=0, seed=0, step=0, image_size=8)


def test_gpt_targets_are_next_tokens() -> None:
    x, y = make_batch("gpt2-small", 3, rank=1, seed=2, step=5)
    assert x.shape == y.shape == (3, GPT_SEQ_LEN)
    # Both halves come from one (B, T + 1) draw, shifted by one token.
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.min()) >= 0 and int(x.max()) < 50257
    with pytest.raises(ValueError, match="seq_len=1025"):
        make_batch("gpt2-small", 1, rank=0, seed=0, step=0, seq_len=1025)


def test_classifier_loss_is_cross_entropy() -> None:
    torch.manual_seed(0)
    model = build_model("srn-100k")
    x, y = make_batch("srn-100k", 8, rank=0, seed=0, step=0)
    loss = loss_fn("srn-100k")(model(x), y)
    assert loss.ndim == 0
    # Uniform logits give exactly log(num_classes).
    uniform = loss_fn("srn-100k")(torch.zeros(8, 10), y)
    assert math.isclose(float(uniform), math.log(10), rel_tol=1e-6)
    loss.backward()


def test_gpt_loss_averages_over_tokens() -> None:
    criterion = loss_fn("gpt2-small")
    x, y = make_batch("gpt2-small", 2, rank=0, seed=0, step=0, seq_len=8)
    uniform = criterion(torch.zeros(2, 8, 50257), y)
    assert math.isclose(float(uniform), math.log(50257), rel_tol=1e-6)
    # A tiny GPT end to end: (B, T, V) logits against (B, T) targets.
    tiny = GPT(GPTConfig(block_size=8, vocab_size=50257, n_layer=1, n_head=2, n_embd=16))
    loss = criterion(tiny(x), y)
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
