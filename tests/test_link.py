"""The link protocol: every kind of link answers the same four questions, and the models ask
nothing else (a new kind is one class: the toy link below runs through each model unchanged)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from commprof.modeling.collective.cluster_link import ClusterLink
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.cost_model import ALGORITHMS, LinkParams, allreduce_ns
from commprof.modeling.collective.link import Link
from commprof.modeling.collective.ring_fit import PiecewiseFit, fit_alpha_beta
from commprof.modeling.step.idle import estimate
from commprof.modeling.trace_whatif.what_if import WhatIf, predicted_ns

SIZES = np.array([1e3, 1e5, 1e7, 1e8])
NOISY_TIMES_NS = np.array([2.1e3, 1.2e5, 0.95e7, 1.1e8])  # off the line: a fit with an interval


def kinds() -> dict[str, Link]:
    fit = fit_alpha_beta(SIZES, NOISY_TIMES_NS, 4)
    return {
        "published": LinkParams(alpha_ns=5e3, beta_ns_per_byte=0.01, algorithm="rabenseifner"),
        "ring fit": fit,
        "piecewise fit": PiecewiseFit(upper_bytes=(1e6,), segments=(fit, fit)),
        "cluster": ClusterLink(cluster=load_cluster("dgx-h100")),
    }


@pytest.mark.parametrize("name", sorted(kinds()))
def test_every_kind_answers_the_protocol(name: str) -> None:
    link = kinds()[name]
    times = link.predict_ns(SIZES, 16)
    assert times.shape == SIZES.shape and np.all(times > 0) and np.all(np.diff(times) > 0)
    assert link.label(16)
    assert link.backend in (None, "nccl")
    ends = link.interval()
    if ends is not None:
        low, high = ends
        assert np.all(low.predict_ns(SIZES, 16) <= times) and np.all(
            times <= high.predict_ns(SIZES, 16)
        )


def test_a_published_link_predicts_under_its_algorithm_with_no_interval() -> None:
    for algorithm in ALGORITHMS:
        link = LinkParams(alpha_ns=5e3, beta_ns_per_byte=0.01, algorithm=algorithm)
        expected = allreduce_ns(SIZES, 8, link, algorithm=algorithm)
        np.testing.assert_array_equal(link.predict_ns(SIZES, 8), expected)
        assert link.interval() is None and link.backend is None and algorithm in link.label(8)
    with pytest.raises(ValueError, match="'butterfly'"):
        LinkParams(alpha_ns=1.0, beta_ns_per_byte=1.0, algorithm="butterfly")


def test_a_fit_interval_is_its_confidence_ends() -> None:
    fit = fit_alpha_beta(SIZES, NOISY_TIMES_NS, 4)
    low, high = fit.interval()
    assert (low.alpha_ns, high.alpha_ns) == (max(0.0, fit.alpha_ci_ns[0]), fit.alpha_ci_ns[1])
    assert low.beta_ns_per_byte == max(0.0, fit.beta_ci_ns_per_byte[0])
    assert high.beta_ns_per_byte == fit.beta_ci_ns_per_byte[1]
    piecewise = PiecewiseFit(upper_bytes=(1e6,), segments=(fit, fit))
    assert piecewise.interval()[1].segments == (high, high)
    assert piecewise.alpha_ns == fit.alpha_ns


def test_a_cluster_is_nccl_with_its_description_as_label() -> None:
    link = ClusterLink(cluster=load_cluster("dgx-h100"))
    assert link.backend == "nccl"
    assert link.label(16) == link.describe(16)


def test_a_clusters_interval_is_its_collective_models_80_percent_interval() -> None:
    link = ClusterLink(cluster=load_cluster("dgx-h100"))
    sizes = np.array([0, 1 << 10, 1 << 20, 1 << 28])
    central, low_ns, high_ns = link.interval_ns(sizes, 16)
    low, high = link.interval()
    np.testing.assert_array_equal(low.predict_ns(sizes, 16), low_ns)
    np.testing.assert_array_equal(high.predict_ns(sizes, 16), high_ns)
    np.testing.assert_array_equal(link.predict_ns(sizes, 16), central)
    assert np.all(low_ns[1:] < central[1:]) and np.all(central[1:] < high_ns[1:])
    assert low.label(16) == link.label(16)  # the same cluster, at an end of its interval


@dataclass(frozen=True, kw_only=True, slots=True)
class ConstantLink:
    """A link kind the models have never seen: every all-reduce takes ``ns``."""

    ns: float

    def predict_ns(self, num_bytes: npt.ArrayLike, world_size: npt.ArrayLike) -> np.ndarray:
        n, _ = np.broadcast_arrays(np.asarray(num_bytes, dtype=np.float64), world_size)
        return np.full(n.shape, self.ns)

    def label(self, world_size: int) -> str:
        return f"constant {self.ns} ns"

    def interval(self) -> None:
        return None

    @property
    def backend(self) -> None:
        return None


def test_a_new_kind_of_link_runs_through_the_models_unchanged() -> None:
    link = ConstantLink(ns=1e6)
    sizes = [("a", 1 << 20), ("b", 1 << 20), ("c", 1 << 20)]
    est = estimate(sizes, world_size=4, bucket_cap_mb=1, link=link, link_label="toy")
    assert [b.allreduce_ns for b in est.buckets] == [1_000_000] * est.num_buckets
    assert est.total_comm_ns == 1_000_000 * est.num_buckets
    scenario = WhatIf(link=link, label=link.label(4), world_size=4)
    out = predicted_ns(
        ("all_reduce", "all_to_all"), [100, 100], [-1, -1], trace_world_size=2, scenario=scenario
    )
    assert out[0] == 1e6 and np.isnan(out[1])  # other types keep their measured time
