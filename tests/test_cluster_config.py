"""cluster.yaml against Ray's own cluster-config schema, and the Dockerfile's text.

Neither `ray up` nor `docker build` can run here (no cloud account, no Docker engine), so these
tests check what can be checked offline: Ray's validator (``ray-schema.json`` through
``ray.autoscaler._private.util.validate_config``, before and after Ray fills in the provider's
defaults), the properties a commprof cluster needs (GPU workers, the project installed, one
authentication mode everywhere), and that the Dockerfile pairs its CUDA base image with the
CUDA build of torch it installs.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_YAML = ROOT / "cluster.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

# Hosts of package and image registries: the project names none of them (every install goes
# through the client's configured default).
REGISTRY_HOSTS = (
    "pypi.org",
    "pythonhosted.org",
    "pytorch.org",
    "docker.io",
    "nvcr.io",
    "ghcr.io",
    "quay.io",
    "debian.org",
    "ubuntu.com",
    "anaconda.org",
    "amazonaws.com",
)


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    """cluster.yaml as ``yaml.safe_load`` reads it."""
    return yaml.safe_load(CLUSTER_YAML.read_text())


def all_commands(config: dict[str, Any]) -> list[str]:
    """Every shell command the launcher runs on some node."""
    keys = (
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    )
    return [cmd for key in keys for cmd in config.get(key) or []]


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, ``\\`` continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def test_cluster_yaml_is_plain_yaml() -> None:
    text = CLUSTER_YAML.read_text()
    assert "!!python" not in text and "!<" not in text  # nothing beyond what safe_load reads
    assert isinstance(yaml.safe_load(text), dict)


def test_ray_schema_accepts_cluster_yaml(cluster: dict[str, Any]) -> None:
    validate_config(cluster)  # as written
    prepared = prepare_config(copy.deepcopy(cluster))  # as `ray up` sees it, defaults filled in
    validate_config(prepared)
    assert prepared["provider"]["type"] == cluster["provider"]["type"]


def test_ray_schema_is_strict(cluster: dict[str, Any]) -> None:
    # Proves the validator above is live: a misspelt key must not pass.
    bad = {**cluster, "head_start_ray_command": []}
    with pytest.raises(jsonschema.ValidationError):
        validate_config(bad)
    node_types = copy.deepcopy(cluster["available_node_types"])
    node_types[cluster["head_node_type"]]["resource"] = {"GPU": 1}
    with pytest.raises(jsonschema.ValidationError):
        validate_config({**cluster, "available_node_types": node_types})


def test_workers_have_gpus_and_the_head_holds_no_ranks(cluster: dict[str, Any]) -> None:
    head = cluster["head_node_type"]
    types = cluster["available_node_types"]
    workers = {name: t for name, t in types.items() if name != head}
    assert workers, "cluster.yaml needs at least one worker node type"
    for name, node_type in workers.items():
        resources = node_type["resources"]
        assert resources.get("GPU", 0) >= 1, f"worker type {name} declares no GPU"
        # A GPU rank's bundle is {CPU: 1, GPU: 1} (actors/gang.py): a CPU for each GPU.
        assert resources.get("CPU", 0) >= resources["GPU"], name
        assert node_type["min_workers"] == node_type["max_workers"], "no autoscaling mid-sweep"
    assert types[head]["resources"] == {"CPU": 0, "GPU": 0}
    total = sum(t["max_workers"] for t in workers.values())
    assert total <= cluster["max_workers"]
    # Every world size of the full study fits PACKed on one worker.
    largest = max(t["resources"]["GPU"] for t in workers.values())
    study = yaml.safe_load((ROOT / "sweeps" / "matrix.yaml").read_text())
    assert max(study["axes"]["world_size"]) <= largest


def test_setup_installs_the_project_and_a_cuda_torch(cluster: dict[str, Any]) -> None:
    assert cluster["file_mounts"]["~/commprof"] == "."
    setup = cluster["setup_commands"]
    project = [i for i, c in enumerate(setup) if re.search(r"pip install .*-e ~/commprof\b", c)]
    torch_pin = [i for i, c in enumerate(setup) if re.search(r'pip install .*"torch==', c)]
    assert project and torch_pin
    # torch before the project: `pip install -e` then keeps the CUDA build already there.
    assert torch_pin[0] < project[0]
    # Start commands use the environment the setup built.
    for cmd in cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]:
        assert "~/venv/bin/ray " in cmd, cmd


def test_auth_mode_is_the_same_everywhere(cluster: dict[str, Any]) -> None:
    text = CLUSTER_YAML.read_text()
    commands = all_commands(cluster)
    modes = {m for cmd in commands for m in re.findall(r"RAY_AUTH_MODE=(\w+)", cmd)}
    assert len(modes) == 1, f"RAY_AUTH_MODE differs between commands: {modes}"
    for cmd in cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]:
        assert "RAY_AUTH_MODE=" in cmd, f"`{cmd}` leaves the auth mode to the default"
    # Interactive shells on the nodes (the driver, `ray status`) get the same mode.
    (mode,) = modes
    assert f"export RAY_AUTH_MODE={mode}" in text
    if mode == "token":  # the same token file on every node
        assert cluster["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"


def test_start_commands_connect_workers_to_the_head(cluster: dict[str, Any]) -> None:
    head = " ".join(cluster["head_start_ray_commands"])
    worker = " ".join(cluster["worker_start_ray_commands"])
    port = re.search(r"--head --port=(\d+)", head)
    assert port is not None
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in head
    assert f"--address=$RAY_HEAD_IP:{port.group(1)}" in worker


def test_no_registry_hosts_in_deployment_files() -> None:
    for path in (CLUSTER_YAML, DOCKERFILE, DOCKERIGNORE):
        text = path.read_text().lower()
        assert "index-url" not in text, path
        for host in REGISTRY_HOSTS:
            assert host not in text, f"{path.name} names {host}"


def test_dockerfile_pairs_cuda_image_with_torch_build(cluster: dict[str, Any]) -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    froms = [args for word, args in instructions if word == "FROM"]
    assert len(froms) == 1
    cuda_image = r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(?:cudnn-)?runtime-ubuntu[\d.]+"
    image = re.fullmatch(cuda_image, froms[0])
    assert image is not None, f"not an nvidia/cuda runtime image: {froms[0]}"
    args = dict(a.split("=", 1) for word, a in instructions if word == "ARG" and "=" in a)
    assert args["TORCH_CUDA"] == f"{image.group(1)}.{image.group(2)}"
    # The image installs the same torch and Ray as the cluster's nodes.
    setup = " ".join(cluster["setup_commands"])
    assert f'"torch=={args["TORCH_VERSION"]}"' in setup
    assert f'"ray[default,data]=={args["RAY_VERSION"]}"' in setup
    runs = [a for word, a in instructions if word == "RUN"]
    assert any('pip install "torch==${TORCH_VERSION}"' in r for r in runs)
    assert any('pip install ".[run]"' in r for r in runs), "installs the project with its run extra"


def test_dockerfile_healthcheck_runs_commprof_check() -> None:
    instructions = dockerfile_instructions(DOCKERFILE.read_text())
    checks = [args for word, args in instructions if word == "HEALTHCHECK"]
    assert len(checks) == 1
    assert re.search(r"\bCMD\b.*\bcommprof check\b", checks[0]), checks[0]
    ignored = DOCKERIGNORE.read_text().split()
    assert ".git" in ignored and ".venv" in ignored and "results" in ignored
