"""Tests for commprof.modeling.memory: the arithmetic, checked against hand sums."""

from __future__ import annotations

import json
import os

import pytest
import torch

from commprof.modeling import memory as mg
from commprof.modeling.memory import (
    GIB,
    MIB,
    Budgets,
    CellShape,
    ModelFootprint,
    detect_budgets,
    evaluate,
    model_footprint,
)
from commprof.training.data import loss_fn, make_batch
from commprof.training.models import GPT, GPTConfig, build_model
from commprof.units import format_bytes

# 1,000,000 fp32 parameters in 10 tensors, 1,000 activation elements per sample.
FP = ModelFootprint(
    model="srn-1m",
    num_parameters=1_000_000,
    num_param_tensors=10,
    activation_elements_per_sample=1_000,
)
BIG = Budgets(
    device_bytes=80 * GIB,
    host_ram_bytes=64 * GIB,
    pinned_bytes=32 * GIB,
    shm_bytes=8 * GIB,
    object_store_bytes=16 * GIB,
)


def _shape(**overrides: object) -> CellShape:
    args: dict[str, object] = dict(
        model="srn-1m",
        world_size=4,
        ranks_per_node=4,
        backend="gloo",
        device="cpu",
        batch_size=8,
        bucket_cap_mb=25.0,
        optimizer="sgd",
        dtype_bytes=4,
        num_steps=6,
    )
    args.update(overrides)
    return CellShape(**args)  # type: ignore[arg-type]


def _pool(decision: mg.GuardDecision, name: str) -> mg.PoolCost:
    (pool,) = [p for p in decision.pools if p.pool == name]
    return pool


# Records of one rank: buckets = min(10 tensors, ceil(4,000,000 B / 25 MiB) + 2) = 3;
# rows = 6 steps x (step + trace + 3 buckets) + 10 param rows + 64 microbench rows = 104.
RECORDS_PER_RANK = (6 * (2 + 3) + 10 + 64) * 256
# The microbenchmark after training: 10 x its largest size, the default sizes' 16 MiB (the model's
# largest bucket, 4,000,000 B, is smaller).
MICROBENCH = 10 * 16 * MIB


def test_cpu_gloo_cell_by_hand() -> None:
    d = evaluate(_shape(), BIG, FP)
    assert d.feasible and d.rejected_pools == ()
    assert [p.pool for p in d.pools] == ["host", "shm", "object_store"]
    # Per rank: params, grads, momentum and DDP buckets 4,000,000 B each; activations 8*1000*4.
    per_rank = 4_000_000 + 4_000_000 + 4_000_000 + 4_000_000 + 8 * 1_000 * 4
    assert per_rank == 16_032_000
    host = _pool(d, "host")
    assert host.need_bytes == 4 * 512 * MIB + 1 * GIB + 4 * (per_rank + MICROBENCH)
    assert host.budget_bytes == 64 * GIB
    assert _pool(d, "shm").need_bytes == 4 * RECORDS_PER_RANK
    assert _pool(d, "object_store").need_bytes == 4 * RECORDS_PER_RANK


def test_cuda_gloo_adam_has_pinned_staging() -> None:
    d = evaluate(_shape(world_size=2, ranks_per_node=2, device="cuda", optimizer="adam"), BIG, FP)
    assert [p.pool for p in d.pools] == ["device", "host", "pinned", "shm", "object_store"]
    # Device, per rank: context + params + grads + 2 Adam moments + buckets + activations.
    device = 512 * MIB + 4_000_000 * (1 + 1 + 2 + 1) + 8 * 1_000 * 4 + MICROBENCH
    assert _pool(d, "device").need_bytes == device
    assert _pool(d, "pinned").need_bytes == 2 * 4_000_000
    # Host: baselines, Ray, the model built on the host, the pinned staging (host memory too).
    host = 2 * 512 * MIB + 1 * GIB + 2 * 4_000_000 + 2 * 4_000_000
    assert _pool(d, "host").need_bytes == host
    assert any(label.startswith("pinned staging") for label, _ in _pool(d, "host").terms)


def test_cuda_nccl_has_no_pinned_staging_but_nccl_shm() -> None:
    d = evaluate(_shape(world_size=8, ranks_per_node=4, backend="nccl", device="cuda"), BIG, FP)
    assert "pinned" not in [p.pool for p in d.pools]
    assert all("pinned" not in label for p in d.pools for label, _ in p.terms)
    assert _pool(d, "host").need_bytes == 4 * 512 * MIB + 1 * GIB + 4 * 4_000_000
    assert _pool(d, "shm").need_bytes == 4 * RECORDS_PER_RANK + 4 * 16 * MIB
    # The object store holds the records of all 8 ranks (2 nodes x 4).
    assert _pool(d, "object_store").need_bytes == 8 * RECORDS_PER_RANK


def test_over_budget_is_rejected_with_pool_named() -> None:
    tight = BIG.with_overrides({"host_ram_bytes": 3 * GIB})
    d = evaluate(_shape(), tight, FP)
    assert not d.feasible
    assert d.rejected_pools == ("host",)
    text = d.explain()
    assert text.splitlines()[0] == "rejected: over budget in host"
    need = 4 * 512 * MIB + 1 * GIB + 4 * (16_032_000 + MICROBENCH)
    assert f"= {format_bytes(need)} > budget 3 GiB: OVER BUDGET" in text  # the one byte formatter


def test_exact_fit_is_feasible_and_one_byte_less_is_not() -> None:
    need = _pool(evaluate(_shape(), BIG, FP), "host").need_bytes
    assert evaluate(_shape(), BIG.with_overrides({"host_ram_bytes": need}), FP).feasible
    d = evaluate(_shape(), BIG.with_overrides({"host_ram_bytes": need - 1}), FP)
    assert d.rejected_pools == ("host",)


def test_cuda_cell_on_machine_without_gpu_is_rejected() -> None:
    d = evaluate(_shape(device="cuda"), BIG.with_overrides({"device_bytes": 0}), FP)
    assert d.rejected_pools == ("device",)
    assert d.reason == "no CUDA device"  # not "> budget 0 B"
    assert d.explain().splitlines()[0] == "rejected: no CUDA device"
    small = evaluate(_shape(device="cuda"), BIG.with_overrides({"device_bytes": 1}), FP)
    assert small.reason == "over budget in device"  # a GPU too small is another verdict


def test_explain_lists_arithmetic_and_record_is_json() -> None:
    d = evaluate(_shape(), BIG, FP)
    line = _pool(d, "shm").explain()
    per_rank, shm = format_bytes(RECORDS_PER_RANK), format_bytes(4 * RECORDS_PER_RANK)
    assert line == (f"shm: ray records [4 ranks x {per_rank}] {shm} = {shm} <= budget 8 GiB: ok")
    record = json.loads(json.dumps(d.to_record()))
    assert record["feasible"] is True and record["rejected_pools"] == []
    assert record["cell"]["model"] == "srn-1m"
    host = record["pools"][0]
    assert host["need_bytes"] == sum(t["bytes"] for t in host["terms"])


def test_activation_formulas_by_hand() -> None:
    # srn-100k geometry: width 70, hidden 286, depth 2.
    srn = mg.srn_activation_elements(input_dim=256, width=70, hidden=286, depth=2, num_classes=10)
    assert srn == 256 + 2 * (2 * 70 + 2 * 286) + 2 * 70 + 2 * 10
    stem = 3 * 224**2 + 2 * 64 * 112**2 + 2 * 64 * 56**2
    stages = (
        4 * 64 * 56**2 * 2
        + (4 * 128 * 28**2 * 2 + 128 * 28**2)
        + (4 * 256 * 14**2 * 2 + 256 * 14**2)
        + (4 * 512 * 7**2 * 2 + 512 * 7**2)
    )
    resnet = mg.resnet_activation_elements(image_size=224, layers=(2, 2, 2, 2), num_classes=1000)
    assert resnet == stem + stages + 512 + 2 * 1000 == 5_346_256
    gpt = mg.gpt_activation_elements(
        seq_len=128, n_layer=12, n_head=12, n_embd=768, vocab_size=50257
    )
    assert gpt == 12 * (16 * 128 * 768 + 2 * 12 * 128 * 128) + 3 * 128 * 768 + 2 * 128 * 50257


def test_model_footprint_uses_closed_form_counts() -> None:
    fp = model_footprint("resnet18")
    assert fp.num_parameters == 11_689_512
    # 20 convolutions (1 stem + 16 in blocks + 3 downsample), 20 batch norms x 2, fc x 2.
    assert fp.num_param_tensors == 20 + 2 * 20 + 2
    assert fp.activation_elements_per_sample == 5_346_256
    with pytest.raises(ValueError, match="footprint is for model"):
        evaluate(_shape(model="resnet18"), BIG, FP)


def _saved_activation_elements(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Elements autograd saves for backward in forward + loss, parameters excluded."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params and t.numel() > 0:
            seen[(t.data_ptr(), t.numel())] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
        loss_fn("gpt2-small" if isinstance(model, GPT) else "srn-1m")(out, y)
    return sum(seen.values())


@pytest.mark.parametrize(("name", "image_size"), [("srn-1m", 224), ("resnet18", 64)])
def test_activation_estimate_matches_autograd(name: str, image_size: int) -> None:
    torch.manual_seed(0)
    model = build_model(name)
    x, y = make_batch(name, 4, rank=0, seed=0, step=0, image_size=image_size)
    measured = _saved_activation_elements(model, x, y) / 4
    estimate = model_footprint(name, image_size=image_size).activation_elements_per_sample
    assert abs(estimate - measured) <= 0.02 * measured  # 2 %: small buffers (BN stats) differ


def test_gpt_activation_estimate_bounds_autograd() -> None:
    cfg = GPTConfig(block_size=64, vocab_size=1000, n_layer=2, n_head=4, n_embd=64)
    model = GPT(cfg)
    x = torch.randint(0, 1000, (4, 64))
    measured = _saved_activation_elements(model, x, torch.randint(0, 1000, (4, 64))) / 4
    estimate = mg.gpt_activation_elements(
        seq_len=64, n_layer=2, n_head=4, n_embd=64, vocab_size=1000
    )
    # Upper bound: the a s^2 attention-score term is conservative (fused attention saves less),
    # and one s V is the logits' gradient, alive in backward but not a saved tensor. Without
    # both the estimate is within 5 % of what autograd keeps.
    assert measured <= estimate
    scores, logits_grad = 2 * 2 * 4 * 64 * 64, 64 * 1000
    assert abs(estimate - scores - logits_grad - measured) <= 0.05 * measured


def test_detect_budgets_reads_the_machine() -> None:
    b = detect_budgets()
    assert b.host_ram_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert b.device_bytes == 0
    assert b.pinned_bytes == int(b.host_ram_bytes * 0.5)
    assert b.object_store_bytes == int(b.host_ram_bytes * 0.3)
    assert b.shm_bytes >= 0


def test_validation_messages() -> None:
    with pytest.raises(ValueError, match="ranks_per_node=5"):
        _shape(ranks_per_node=5)
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        _shape(optimizer="lamb")
    with pytest.raises(ValueError, match="nccl"):
        _shape(backend="nccl", device="cpu")
    with pytest.raises(ValueError, match="unknown budget keys"):
        BIG.with_overrides({"gpu_bytes": 1})
    with pytest.raises(ValueError, match="host_ram_bytes=-1"):
        BIG.with_overrides({"host_ram_bytes": -1})
