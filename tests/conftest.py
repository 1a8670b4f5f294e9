"""Shared fixtures: one real local Ray for the whole session, small matrices, and the one rule for
tests that need something outside the repository (skipped on a plain clone, failed under CI)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prereqs import check_needs

# gloo on one machine talks over loopback (docs/design.md, Measured facts); set before any
# process group starts.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(path, tool): skipped where the folder or program is missing, "
        "failed under CI (tests/prereqs.py)"
    )  # fmt: skip


def pytest_runtest_setup(item: pytest.Item) -> None:
    check_needs(item)


RAY_TEST_CPUS = 4
"""CPUs the test cluster advertises: enough for one 4-rank gang (oversubscribed on 2 cores)."""


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A real local Ray, started once per session; yields its GCS address."""
    import ray

    from commprof.actors.gang import ACTOR_NAMESPACE

    ctx = ray.init(
        address="local",  # a fresh Ray, even where `ray start` or a Cluster recorded another
        num_cpus=RAY_TEST_CPUS,
        include_dashboard=False,
        namespace=ACTOR_NAMESPACE,
        log_to_driver=False,
        logging_level="WARNING",
    )
    try:
        yield ctx.address_info["gcs_address"]
    finally:
        ray.shutdown()


def write_matrix(path: Path, text: str) -> Path:
    """Write a matrix YAML file and return its path."""
    path.write_text(text)
    return path
