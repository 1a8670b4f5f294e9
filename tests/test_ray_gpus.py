"""GPU rank actors on a real Ray with fake GPUs: the GPU each rank takes, the environment it
sees, where the ranks meet. Ray runs in a subprocess: the session's ``ray_cluster`` advertises no
GPUs, and one process holds one Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commprof.actors.execution import rendezvous_host
from commprof.actors.gang import Gang, rank_env

REPO = Path(__file__).resolve().parent.parent

FAKE_GPU_PROBE = """
import json, os, subprocess, sys, ray
from commprof.actors.gang import reserve, start_gang
from commprof.actors.execution import rendezvous_host
ctx = ray.init(
    address="local", num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False
)
try:
    # `commprof check` from another process, pointed at this cluster
    check = subprocess.run(
        [sys.executable, "-m", "commprof", "check", "--json"],
        env={**os.environ, "RAY_ADDRESS": ctx.address_info["gcs_address"]},
        capture_output=True, text=True, timeout=1800, check=True,  # hang guards here: 1,800 s
    )
    env = {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
    def gang(shape):
        group = reserve(shape)
        ray.get(group.ready(), timeout=1800)
        return start_gang(shape, group, ready_timeout_s=1800, env=env)
    gangs = [gang((2, "cuda", "PACK")) for _ in range(2)]
    seen = [ray.get([a.describe.remote() for a in g.actors], timeout=1800) for g in gangs]
    host = rendezvous_host(gangs[0])
    port = ray.get(gangs[0].actors[0].open_store.remote(host, 2, 30.0), timeout=1800)
    nodes = json.loads(check.stdout)["ray_nodes"]
    print(json.dumps({"seen": seen, "host": host, "port": port, "nodes": nodes}))
finally:
    ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.ray
def test_gpu_ranks_take_rays_gpu_ids_and_see_the_matrix_env() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FAKE_GPU_PROBE],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    ranks = [rank for gang in probe["seen"] for rank in gang]
    # four ranks in two gangs: each its own GPU, the device index the id Ray assigned (a gang's
    # local rank would have sent both gangs to GPUs 0 and 1)
    assert sorted(r["gpu_ids"][0] for r in ranks) == ["0", "1", "2", "3"]
    assert all(len(r["gpu_ids"]) == 1 and r["device_index"] == int(r["gpu_ids"][0]) for r in ranks)
    for rank in ranks:
        assert rank["cuda_visible_devices"] is None  # Ray masked nothing
        assert rank["env"]["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
        assert rank["env"]["NCCL_DEBUG"] == "INFO"  # the matrix's env section, in the rank
        assert rank["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"  # the matrix overrides
    assert "NCCL_DEBUG" not in os.environ  # ... and set nowhere else
    # one node: the ranks meet on loopback, at the port rank 0 bound itself
    assert probe["host"] == "127.0.0.1" and 0 < probe["port"] < 65536
    # commprof check lists the GPUs Ray sees per node
    ((node,),) = [probe["nodes"]]
    assert (node["gpus"], node["cpus"]) == (4.0, 4.0)


def test_ranks_meet_at_rank_zeros_node() -> None:
    gang = Gang(
        shape=(2, "cuda", "SPREAD"),
        group=None,  # type: ignore[arg-type]  # no placement group: the address rule alone
        actors=[],
        gang_id=0,
        nodes=[("node-b", "10.0.0.2"), ("node-a", "10.0.0.1")],
    )
    assert rendezvous_host(gang) == "10.0.0.2"  # rank 0's node, wherever the driver runs
    assert gang.local_ranks() == [0, 0]


def test_rank_env_defaults() -> None:
    assert rank_env("cpu") == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert rank_env("cuda", {"NCCL_ALGO": "Ring"}) == {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
        "NCCL_ALGO": "Ring",
    }
