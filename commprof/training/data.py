"""Synthetic training batches: deterministic per (seed, rank, step), no I/O.

Every batch is drawn on the CPU from a ``torch.Generator`` seeded by a hash of
``(seed, rank, step)`` and then moved to the target device, so the same triple
gives bit-identical batches on any machine and device, different ranks get
different data (as a DistributedSampler would give them), and nothing is read
from disk. Communication cost does not depend on the values, only on shapes.

Shapes per family:

- ``srn-*``: inputs ``(B, 256)`` float32 ~ N(0, 1), targets ``(B,)`` in ``[0, 10)``.
- ``resnet18``: inputs ``(B, 3, S, S)`` float32 ~ N(0, 1) with ``S = image_size``
  (default :data:`RESNET_IMAGE_SIZE` = 224), targets ``(B,)`` in ``[0, 1000)``.
- ``gpt2-small``: ``B`` token sequences of ``T + 1`` tokens uniform over the
  vocabulary; inputs are tokens ``[0, T)``, targets tokens ``[1, T]`` (next-token
  prediction, as nanoGPT's ``get_batch``), ``T = seq_len`` (default
  :data:`GPT_SEQ_LEN` = 128, much shorter than the 1024-token context so steps stay
  affordable on CPUs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from commprof.training.models import GPTConfig, ResNetGeometry, SRNGeometry, model_spec

__all__ = [
    "GPT_SEQ_LEN",
    "RESNET_IMAGE_SIZE",
    "LossFn",
    "batch_seed",
    "example_batch",
    "loss_fn",
    "make_batch",
]

GPT_SEQ_LEN = 128
"""Tokens per synthetic GPT sequence (the model's context is 1024; see module docstring)."""
RESNET_IMAGE_SIZE = 224
"""Side of the synthetic square images for ResNet-18 (ImageNet's training crop)."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def batch_seed(seed: int, rank: int, step: int) -> int:
    """Generator seed for one (seed, rank, step): the first 63 bits of a BLAKE2b hash.

    Hashing (rather than e.g. ``seed + rank * K + step``) keeps distinct triples
    from colliding for any ranges of the three numbers.
    """
    for field, value in (("seed", seed), ("rank", rank), ("step", step)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{field}={value!r}: must be a non-negative int")
    digest = hashlib.blake2b(f"{seed}:{rank}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def example_batch(
    model_name: str,
    batch_size: int,
    generator: torch.Generator,
    *,
    device: str | torch.device = "cpu",
    image_size: int = RESNET_IMAGE_SIZE,
    seq_len: int = GPT_SEQ_LEN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one (inputs, targets) batch for ``model_name`` from ``generator``.

    Args:
        model_name: A name accepted by :func:`commprof.training.models.build_model`.
        batch_size: Samples in the batch.
        generator: A CPU generator; the values depend only on its state.
        device: Where the returned tensors live.
        image_size: Image side for ResNet models (smaller values keep CPU tests fast).
        seq_len: Tokens per sequence for GPT models, at most the model's context.

    Returns:
        ``(inputs, targets)`` on ``device``; shapes in the module docstring.

    Raises:
        ValueError: Unknown model, non-positive sizes, or ``seq_len`` beyond the context.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: must be at least 1")
    g = model_spec(model_name).geometry
    if isinstance(g, SRNGeometry):
        inputs = torch.randn(batch_size, g.input_dim, generator=generator)
        targets = torch.randint(0, g.num_classes, (batch_size,), generator=generator)
    elif isinstance(g, ResNetGeometry):
        if image_size < 32:
            raise ValueError(f"image_size={image_size!r}: ResNet needs at least 32 pixels a side")
        shape = (batch_size, g.in_channels, image_size, image_size)
        inputs = torch.randn(*shape, generator=generator)
        targets = torch.randint(0, g.num_classes, (batch_size,), generator=generator)
    else:
        assert isinstance(g, GPTConfig)
        if not 1 <= seq_len <= g.block_size:
            raise ValueError(f"seq_len={seq_len!r}: must be in [1, {g.block_size}]")
        tokens = torch.randint(0, g.vocab_size, (batch_size, seq_len + 1), generator=generator)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return inputs.to(device), targets.to(device)


def make_batch(
    model_name: str,
    batch_size: int,
    *,
    rank: int,
    seed: int,
    step: int,
    device: str | torch.device = "cpu",
    image_size: int = RESNET_IMAGE_SIZE,
    seq_len: int = GPT_SEQ_LEN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch rank ``rank`` trains on at ``step`` of a run with ``seed``.

    Args:
        model_name: Model name.
        batch_size: Per-rank batch size.
        rank: Global rank.
        seed: The run's seed.
        step: Training step (0-based).
        device: Where the tensors live.
        image_size: Image side for ResNet models.
        seq_len: Tokens per sequence for GPT models.

    Returns:
        ``(inputs, targets)``, identical for identical arguments.
    """
    generator = torch.Generator(device="cpu").manual_seed(batch_seed(seed, rank, step))
    return example_batch(
        model_name, batch_size, generator, device=device, image_size=image_size, seq_len=seq_len
    )


def _token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # (B, T, V) logits against (B, T) targets: mean over all B*T tokens, as nanoGPT.
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def loss_fn(model_name: str) -> LossFn:
    """Training loss for ``model_name``: cross entropy (mean over samples or tokens).

    Args:
        model_name: Model name.

    Returns:
        ``loss(outputs, targets) -> scalar tensor``.
    """
    if isinstance(model_spec(model_name).geometry, GPTConfig):
        return _token_cross_entropy
    return F.cross_entropy
