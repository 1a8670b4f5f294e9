"""The sweep estimate of ``commprof check`` follows its declared formula: a cell's time grows by
its step time with every step, a sweep adds its cells and a gang start per shape, and an
embedded Ray's sweep is scaled by the square root of this machine's load per core. How close the
estimate comes to a real sweep is measured in ``benchmarks/bench_check_estimate.py``, not here:
a wall-clock bound in a test breaks when the machine's load changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from commprof import matrix
from sweeps import guard
from sweeps.guard import contention, estimate_cell_s, estimate_sweep_s

REPO = Path(__file__).resolve().parent.parent
NUM_PARAMS = 10**6


def _smoke() -> list[tuple[matrix.Cell, int]]:
    return [(cell, NUM_PARAMS) for cell in matrix.load(REPO / "sweeps" / "smoke.yaml").cells]


def test_a_cell_grows_by_its_step_time_with_every_step() -> None:
    cell = matrix.Cell(model="srn-1m", world_size=2, bucket_cap_mb=25.0, steps=8)
    longer = dataclasses.replace(cell, steps=18)
    p = cell.world_size
    step_s = (
        guard.TRAIN_FLOPS_PER_PARAM_SAMPLE * NUM_PARAMS * cell.batch_size / guard.CPU_FLOPS_PER_S
        + 2 * (p - 1) / p * NUM_PARAMS * 4 / guard.LOOPBACK_BYTES_PER_S
        + guard.STEP_OVERHEAD_S
    )
    grown = estimate_cell_s(longer, NUM_PARAMS) - estimate_cell_s(cell, NUM_PARAMS)
    assert grown == pytest.approx(10 * step_s, rel=1e-9)
    profiled = dataclasses.replace(cell, profile=True)
    grown = estimate_cell_s(profiled, NUM_PARAMS) - estimate_cell_s(cell, NUM_PARAMS)
    assert grown == pytest.approx(guard.PROFILE_S, rel=1e-9)
    bigger = estimate_cell_s(cell, 2 * NUM_PARAMS) - estimate_cell_s(cell, NUM_PARAMS)
    assert bigger > 0


def test_a_sweep_adds_its_cells_and_a_gang_start_per_shape() -> None:
    cells = _smoke()
    shapes = {cell.gang_shape for cell, _ in cells}
    cells_s = sum(estimate_cell_s(c, n) for c, n in cells)
    alone = estimate_sweep_s(cells, embedded=False, load_1m=0.0, num_cpus=2)
    assert alone == pytest.approx(guard.GANG_START_S * len(shapes) + cells_s, rel=1e-12)
    fewer = estimate_sweep_s(cells[:-1], embedded=False, load_1m=0.0, num_cpus=2)
    assert alone - fewer == pytest.approx(estimate_cell_s(*cells[-1]), rel=1e-9)
    assert estimate_sweep_s([], embedded=True, load_1m=8.0, num_cpus=2) == 0.0


def test_an_embedded_sweep_grows_with_the_load_per_core() -> None:
    cells = _smoke()
    alone = estimate_sweep_s(cells, embedded=False, load_1m=0.0, num_cpus=2)
    idle = estimate_sweep_s(cells, embedded=True, load_1m=0.0, num_cpus=2)
    assert idle == pytest.approx(guard.DRIVER_START_S + alone, rel=1e-12)
    # up to one runnable thread a core nothing slows; past it, the square root of load per core
    assert estimate_sweep_s(cells, embedded=True, load_1m=2.0, num_cpus=2) == idle
    at_8 = estimate_sweep_s(cells, embedded=True, load_1m=8.0, num_cpus=2)
    assert at_8 == pytest.approx(2 * idle, rel=1e-12)  # sqrt(8 / 2)
    loads = [0.0, 1.0, 2.5, 4.0, 9.0, 30.0]
    sweeps = [estimate_sweep_s(cells, embedded=True, load_1m=x, num_cpus=2) for x in loads]
    assert sweeps == sorted(sweeps) and sweeps[-1] > sweeps[0]
    # a cluster's load is not known here: it is not counted
    assert estimate_sweep_s(cells, embedded=False, load_1m=30.0, num_cpus=2) == alone
    assert [contention(x, 4) for x in (-1.0, 4.0, 16.0, 36.0)] == [1.0, 1.0, 2.0, 3.0]
