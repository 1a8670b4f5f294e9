"""The benchmark's kernel_heavy_150k trace shape, built small and parsed by the real parser."""

from __future__ import annotations

import importlib
import math
import random
from pathlib import Path
from types import ModuleType

import pytest

from commprof.traces.metrics import trace_overlap
from commprof.traces.trace_parser import parse_trace

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def shapes(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports make_nccl_trace beside it
    return importlib.import_module("make_trace_shapes")


def test_kernel_heavy_150k_holds_150k_collectives_in_1m_events(shapes: ModuleType) -> None:
    step = shapes._kernel_heavy_150k(random.Random(0))
    lines = [text for text, _, _ in step.lines if text]
    num_steps = math.ceil(1_000_000 / len(lines))
    assert num_steps * shapes.COLLECTIVES_PER_STEP == 150_000
    assert 1_000_000 <= num_steps * len(lines) < 1_010_000
    kernels = sum('"cat":"kernel"' in t for t in lines)
    runtime = sum('"cat":"cuda_runtime"' in t for t in lines)
    assert 0.35 < kernels / len(lines) < 0.45  # kernel-heavy: issue #29's 40 % kernels
    assert 0.40 < runtime / len(lines) < 0.50
    assert "kernel_heavy_150k" in shapes.ALL_SHAPES
    assert "kernel_heavy_150k" not in shapes.SHAPES  # not in the default run


def test_kernel_heavy_150k_parses_into_typed_collectives(
    shapes: ModuleType, tmp_path: Path
) -> None:
    info = shapes.write_shape("kernel_heavy_150k", tmp_path, min_events=12_000)
    parsed = parse_trace(info["path"])
    coll = parsed.collectives
    assert parsed.regime == "cuda-nccl"
    assert len(coll) == info["num_steps"] * shapes.COLLECTIVES_PER_STEP
    assert set(coll["type_source"]) == {"args"}
    assert coll["collective_type"].value_counts().to_dict() == {
        "all_reduce": len(coll) // 3,
        "all_gather": len(coll) // 3,
        "reduce_scatter": len(coll) // 3,
    }
    assert not coll["step"].isna().any()
    assert coll["seq"].tolist() == list(range(len(coll)))
    assert (coll["num_bytes"] % (4096 * 2) == 0).all()  # nelems a multiple of 4096, bf16
    comm_ns, overlap_ns = trace_overlap(parsed)
    assert 0 < overlap_ns < comm_ns
