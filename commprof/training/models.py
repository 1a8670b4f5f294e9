"""The models commprof trains: a size-scalable residual MLP, ResNet-18 and GPT-2 small.

Every model has a :class:`ModelSpec` (family and geometry) from which its parameter
count and per-tensor sizes follow in closed form, so callers (the cost model, the
memory guard, DDP bucket assignment) can reason about a 400M-parameter model
without allocating it. Tests check the arithmetic against real modules.

Names: ``srn-100k``, ``srn-1m``, ``srn-10m``, ``srn-50m``, ``srn-150m``, ``srn-400m``,
``resnet18``, ``gpt2-small``. Any ``srn-<N>k`` or ``srn-<N>m`` (N a positive integer,
at least 10k parameters) is accepted as well.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

# Names, geometry and closed-form counts live torch-free in the catalog; re-exported here.
from commprof.catalog import (
    MODEL_NAMES,
    GPTConfig,
    ModelSpec,
    ResNetGeometry,
    SRNGeometry,
    count_parameters,
    gpt_parameter_sizes,
    model_spec,
    parameter_sizes,
    resnet_parameter_sizes,
    solve_srn_geometry,
    srn_depth_for_target,
    srn_num_parameters,
    srn_parameter_sizes,
)

__all__ = [
    "GPT",
    "MODEL_NAMES",
    "GPTConfig",
    "ModelSpec",
    "ResNet",
    "ResNetGeometry",
    "SRNGeometry",
    "ScalableResidualNet",
    "build_from_spec",
    "build_model",
    "count_parameters",
    "gpt_parameter_sizes",
    "model_spec",
    "parameter_sizes",
    "resnet_parameter_sizes",
    "solve_srn_geometry",
    "srn_depth_for_target",
    "srn_num_parameters",
    "srn_parameter_sizes",
]


# ---------------------------------------------------------------------------------------
# ScalableResidualNet


class ResidualBlock(nn.Module):
    """Pre-norm MLP block: ``x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ScalableResidualNet(nn.Module):
    """Residual MLP whose size is set by :class:`SRNGeometry`.

    input_proj -> ``depth`` x :class:`ResidualBlock` -> LayerNorm -> head.
    Input ``(B, input_dim)`` float, output ``(B, num_classes)`` logits.
    """

    def __init__(self, geometry: SRNGeometry) -> None:
        super().__init__()
        g = geometry
        self.input_proj = nn.Linear(g.input_dim, g.width)
        self.blocks = nn.Sequential(*[ResidualBlock(g.width, g.hidden) for _ in range(g.depth)])
        self.norm = nn.LayerNorm(g.width)
        self.head = nn.Linear(g.width, g.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.input_proj(x))))


# ---------------------------------------------------------------------------------------
# ResNet-18, laid out and named as torchvision.models.resnet builds it
# (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3x3 convs with batch norm, optional downsample."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet with BasicBlocks; ``ResNetGeometry()`` gives ResNet-18 (11,689,512 params)."""

    def __init__(self, geometry: ResNetGeometry) -> None:
        super().__init__()
        g = geometry
        self.conv1 = nn.Conv2d(g.in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = 64
        stages = []
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), g.layers, strict=True)):
            stride = 1 if i == 0 else 2
            layer = [BasicBlock(inplanes, planes, stride)]
            layer += [BasicBlock(planes, planes) for _ in range(blocks - 1)]
            inplanes = planes
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, g.num_classes)
        # Same initialisation as torchvision's ResNet.__init__.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------------------------------
# nanoGPT-style decoder (karpathy/nanoGPT model.py; Radford et al. 2019, GPT-2).


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused qkv projection."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    """GPT-2 feed-forward: Linear(C, 4C) -> GELU -> Linear(4C, C)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _Transformer(nn.Module):
    """nanoGPT's ``transformer`` container (a typed module, same parameter names)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)


class GPT(nn.Module):
    """Decoder-only transformer; input ``(B, T)`` token ids, output ``(B, T, vocab)`` logits.

    ``lm_head.weight`` is the same Parameter as ``transformer.wte.weight`` (weight tying),
    so ``named_parameters()`` and DDP see it once, as ``transformer.wte.weight``.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = _Transformer(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # nanoGPT's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for pname, p in self.named_parameters():
            if pname.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, t = idx.shape
        if t > self.config.block_size:
            raise ValueError(
                f"sequence length {t} exceeds block_size={self.config.block_size}: "
                "use shorter sequences"
            )
        pos = torch.arange(t, device=idx.device)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))
        for block in tr.h:
            x = block(x)
        return self.lm_head(tr.ln_f(x))


# ---------------------------------------------------------------------------------------


def build_from_spec(spec: ModelSpec, *, device: str | torch.device | None = None) -> nn.Module:
    """Instantiate the module a spec describes.

    Args:
        spec: The model spec.
        device: Where to create parameters; ``"meta"`` allocates no storage.

    Returns:
        The module, in training mode.
    """
    with torch.device(device) if device is not None else contextlib.nullcontext():
        g = spec.geometry
        if isinstance(g, SRNGeometry):
            return ScalableResidualNet(g)
        if isinstance(g, ResNetGeometry):
            return ResNet(g)
        return GPT(g)


def build_model(name: str, *, device: str | torch.device | None = None) -> nn.Module:
    """Build model ``name`` (see :data:`MODEL_NAMES`).

    Args:
        name: Model name.
        device: Where to create parameters (default: the current default device);
            ``"meta"`` builds the structure without allocating storage.

    Returns:
        The module.

    Raises:
        ValueError: Unknown name (the message lists the valid ones).
    """
    return build_from_spec(model_spec(name), device=device)
