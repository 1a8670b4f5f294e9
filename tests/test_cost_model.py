"""Closed-form checks of the all-reduce cost models."""

from __future__ import annotations

import numpy as np
import pytest

from commprof.modeling.collective.cost_model import (
    ALGORITHMS,
    LinkParams,
    allreduce_ns,
    binary_tree_allreduce_ns,
    bus_bandwidth_factor,
    nonnegative_line,
    rabenseifner_allreduce_ns,
    recursive_doubling_allreduce_ns,
    ring_allreduce_ns,
    ring_coefficients,
)

LINK = LinkParams(alpha_ns=10.0, beta_ns_per_byte=0.5)


def test_ring_matches_patarasuk_yuan_formula() -> None:
    # 2(p-1) alpha + 2((p-1)/p) n beta with p=4, n=1000
    expected = 2 * 3 * 10.0 + 2 * (3 / 4) * 1000 * 0.5
    assert ring_allreduce_ns(1000, 4, LINK) == pytest.approx(expected)


def test_ring_gamma_term_and_single_rank() -> None:
    link = LinkParams(alpha_ns=10.0, beta_ns_per_byte=0.5, gamma_ns_per_byte=0.25)
    assert ring_allreduce_ns(1000, 2, link) == pytest.approx(
        2 * 10 + 1000 * 0.5 + 0.5 * 1000 * 0.25
    )
    assert ring_allreduce_ns(1000, 1, LINK) == 0.0


def test_vectorised_over_sizes_and_world_sizes() -> None:
    sizes = np.array([1e3, 1e6, 1e9])[:, None]
    worlds = np.array([2, 4, 8])[None, :]
    grid = ring_allreduce_ns(sizes, worlds, LINK)
    assert grid.shape == (3, 3)
    for i, n in enumerate(sizes[:, 0]):
        for j, p in enumerate(worlds[0]):
            assert grid[i, j] == pytest.approx(2 * (p - 1) * 10 + 2 * (p - 1) / p * n * 0.5)
    c_alpha, c_beta = ring_coefficients(sizes, worlds)
    assert np.allclose(c_alpha * 10 + c_beta * 0.5, grid)


def test_recursive_doubling_power_of_two_and_not() -> None:
    # p=8: lg p (alpha + n beta)
    assert recursive_doubling_allreduce_ns(100, 8, LINK) == pytest.approx(3 * (10 + 100 * 0.5))
    # p=6: folded into p'=4 (2 steps) plus 2 extra full-message steps
    assert recursive_doubling_allreduce_ns(100, 6, LINK) == pytest.approx(4 * (10 + 100 * 0.5))


def test_rabenseifner_and_tree() -> None:
    assert rabenseifner_allreduce_ns(1000, 4, LINK) == pytest.approx(
        2 * 2 * 10 + 2 * (3 / 4) * 1000 * 0.5
    )
    # ceil(lg 5) = 3: 2*3 (alpha + n beta)
    assert binary_tree_allreduce_ns(1000, 5, LINK) == pytest.approx(6 * (10 + 1000 * 0.5))


def test_ring_is_cheapest_in_bandwidth_for_large_messages() -> None:
    link = LinkParams(alpha_ns=0.0, beta_ns_per_byte=1.0)
    times = {name: float(model(1e9, 8, link)) for name, model in ALGORITHMS.items()}
    assert times["ring"] == pytest.approx(times["rabenseifner"])
    assert times["ring"] < times["recursive-doubling"] < times["binary-tree"]


def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="world_size"):
        ring_allreduce_ns(10, 0, LINK)
    with pytest.raises(ValueError, match="world_size"):
        ring_allreduce_ns(10, 2.5, LINK)
    with pytest.raises(ValueError, match="num_bytes"):
        ring_allreduce_ns(-1, 2, LINK)
    with pytest.raises(ValueError, match="ring"):
        allreduce_ns(10, 2, LINK, algorithm="butterfly")
    with pytest.raises(ValueError, match="alpha_ns"):
        LinkParams(alpha_ns=-1.0, beta_ns_per_byte=1.0)


def test_from_bandwidth_and_busbw_factor() -> None:
    link = LinkParams.from_bandwidth(bandwidth_bytes_per_s=2e9, alpha_ns=5.0)
    assert link.beta_ns_per_byte == pytest.approx(0.5)
    assert bus_bandwidth_factor(4) == pytest.approx(1.5)


def test_nonnegative_line_in_closed_form() -> None:
    # An exact line is returned as it is.
    assert nonnegative_line([1, 2, 4], [12, 14, 18]) == pytest.approx((10.0, 2.0))
    # y falls with x: no per-x cost was seen, the median is the constant.
    assert nonnegative_line([1, 2, 4], [9, 7, 3]) == (7.0, 0.0)
    # A negative intercept: the least-squares line through the origin, sum(xy) / sum(x^2).
    assert nonnegative_line([1, 2, 3], [1, 3, 5]) == pytest.approx((0.0, 22 / 14))
