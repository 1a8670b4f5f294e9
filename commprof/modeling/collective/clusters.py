"""Cluster descriptions: nodes of GPUs, the fabric inside a node and the NICs between nodes.

The bundled descriptions live in ``clusters.yaml`` (package data); a user's own file of the same
schema is validated the same way (``load_cluster(path)``): every error names the file, the key
and the value to change, and unknown keys are refused. Each published figure carries its source,
URL, access date and conversion in the YAML, as ``interconnects.yaml`` does for links.

Two efficiencies turn a published rate into what NCCL can drive
(``commprof.modeling.collective.collectives``
uses them):

- ``intra_efficiency``: NCCL's own per-link NVLink bandwidth over the published per-link rate
  (``SM80_NVLINK_BW`` 20.0 and ``SM90_NVLINK_BW`` 20.6 GB/s in NVIDIA/nccl src/graph/topo.h against
  25 GB/s per link and direction: 0.80 for A100, 0.824 for H100). Where no such figure is
  published (AMD Infinity Fabric, PCIe boxes) the description says what it assumed.
- ``net_efficiency``: left out, it is NCCL's ring search step, the largest bandwidth of
  ``speedArrayInter`` (NVIDIA/nccl src/graph/search.cc: 48, 30, 28, 24, 20, 18, 15, 12, 10 ...
  GB/s) at or below one NIC's rate, over that rate (0.96 for 400, 200 and 100 Gb/s NICs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from commprof.yamlio import load_yaml, read_text

FABRICS = ("nvswitch", "nvlink-mesh", "xgmi-mesh", "pcie")
"""Kinds of intra-node fabric: NVSwitch (every GPU at full rate to every other), a direct NVLink
or Infinity Fabric mesh, or PCIe through the host."""
NIC_PATHS = ("pxb", "phb")
"""Where a GPU reaches its NIC, as NCCL's topology names the path (NVIDIA/nccl src/graph/paths.cc):
``pxb``, through PCIe switches only (the NIC beside the GPU); ``phb``, through a CPU's PCIe host
bridge (a NIC on the CPU's lanes, as on a GH200 node, whose GPU joins its Grace CPU by C2C)."""
NET_SPEED_STEPS_GBPS = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0)
"""NCCL's inter-node ring search speeds in GB/s (``speedArrayInter``, NVIDIA/nccl
src/graph/search.cc, commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 era)."""
_SOURCE_KEYS = ("source", "url", "accessed", "conversion")


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """One cluster: identical nodes of GPUs, a fabric inside each node, NICs between them."""

    name: str
    """Identifier used with ``--cluster`` (e.g. ``dgx-a100``)."""
    description: str
    """Human-readable summary."""
    gpus_per_node: int
    """GPUs in one node (>= 1)."""
    num_nodes: int
    """Nodes available (world sizes up to ``gpus_per_node * num_nodes`` are allowed)."""
    intra_fabric: str
    """One of ``FABRICS``."""
    intra_bytes_per_s: float
    """Published per-GPU intra-node bandwidth, per direction, in bytes/s."""
    intra_efficiency: float
    """Fraction of ``intra_bytes_per_s`` NCCL drives (see the module docstring)."""
    nics_per_node: int
    """Network interfaces of one node used by NCCL (0: a single-node machine)."""
    nic_bytes_per_s: float
    """One NIC's published data rate per direction in bytes/s (0 with no NIC)."""
    net_efficiency: float
    """Fraction of a NIC's rate NCCL drives (default from ``NET_SPEED_STEPS_GBPS``)."""
    nvls: bool
    """NVLink SHARP in the NVSwitch (H100 and later): NCCL's NVLS and NVLSTree algorithms."""
    ll128: bool
    """NCCL enables the LL128 protocol (NVLink systems of one compute capability)."""
    nic_path: str
    """One of ``NIC_PATHS`` (default ``pxb``): on ``phb`` NCCL enables no LL128 across nodes
    (``ncclTopoTuneModel`` wants the graph's GPU-to-NIC path at most PXB, PXN on sm90, in
    NVIDIA/nccl src/graph/tuning.cc v2.19 to v2.26; from 2.27 a GH200's path is P2C, which
    ``NCCL_LL128_C2C`` admits by default)."""
    gpu_generation: str
    """``volta``, ``ampere``, ``hopper``, ``blackwell`` or ``other``: picks NCCL's per-generation
    caps (``collectives.PER_CHANNEL_CAPS_GBPS``)."""
    num_channels: int | None
    """Ring and tree channels, where a run pins them (``NCCL_MIN_NCHANNELS`` /
    ``NCCL_MAX_NCHANNELS``); None (the default): what NCCL's topology search finds
    (``commprof.modeling.collective.nccl_search``)."""
    sources: tuple[dict[str, str], ...]
    """Where each figure comes from: ``figure``, ``source``, ``url``, ``accessed``,
    ``conversion``."""

    def __post_init__(self) -> None:
        where = f"cluster {self.name!r}"
        if self.gpus_per_node < 1 or self.num_nodes < 1:
            raise ValueError(
                f"{where}: gpus_per_node ({self.gpus_per_node}) and num_nodes ({self.num_nodes})"
                " must be >= 1"
            )
        if self.intra_fabric not in FABRICS:
            raise ValueError(
                f"{where}: intra_fabric {self.intra_fabric!r} is not one of {list(FABRICS)}"
            )
        if not self.intra_bytes_per_s > 0:
            raise ValueError(
                f"{where}: intra_bytes_per_s must be > 0, got {self.intra_bytes_per_s}"
            )
        for key in ("intra_efficiency", "net_efficiency"):
            value = getattr(self, key)
            if not 0 < value <= 1:
                raise ValueError(f"{where}: {key} must be in (0, 1], got {value}")
        if self.nics_per_node < 0 or (self.nics_per_node > 0) != (self.nic_bytes_per_s > 0):
            raise ValueError(
                f"{where}: nics_per_node ({self.nics_per_node}) and nic_bytes_per_s "
                f"({self.nic_bytes_per_s}) must both be > 0, or both 0 for a single node"
            )
        if self.num_nodes > 1 and self.nics_per_node == 0:
            raise ValueError(f"{where}: num_nodes {self.num_nodes} > 1 needs nics_per_node > 0")
        if self.nic_path not in NIC_PATHS:
            raise ValueError(f"{where}: nic_path {self.nic_path!r} is not one of {list(NIC_PATHS)}")
        if self.gpu_generation not in ("volta", "ampere", "hopper", "blackwell", "other"):
            raise ValueError(f"{where}: gpu_generation {self.gpu_generation!r} is not known")
        if self.num_channels is not None and self.num_channels < 1:
            raise ValueError(f"{where}: num_channels must be >= 1, got {self.num_channels}")

    def ll128_on(self, num_nodes: int) -> bool:
        """Whether NCCL enables LL128 for a communicator of ``num_nodes`` nodes: ``ll128``, and
        across nodes only on a GPU-to-NIC path NCCL admits (``nic_path``)."""
        return self.ll128 and (num_nodes == 1 or self.nic_path == "pxb")

    @property
    def max_world_size(self) -> int:
        """GPUs in the whole cluster."""
        return self.gpus_per_node * self.num_nodes

    def nodes_for(self, world_size: int) -> int:
        """Nodes a job of ``world_size`` ranks spans, packed ``gpus_per_node`` to a node.

        Raises:
            ValueError: the world size does not fit the cluster, or does not fill whole nodes
                (NCCL's hierarchy assumes as many ranks on every node).
        """
        if world_size < 1 or world_size > self.max_world_size:
            raise ValueError(
                f"--world-size {world_size}: cluster {self.name!r} has {self.max_world_size} GPUs "
                f"({self.num_nodes} nodes x {self.gpus_per_node}); choose 1 to "
                f"{self.max_world_size}"
            )
        if world_size <= self.gpus_per_node:
            return 1
        if world_size % self.gpus_per_node:
            raise ValueError(
                f"--world-size {world_size}: spans several nodes of cluster {self.name!r}, so it "
                f"must be a multiple of its {self.gpus_per_node} GPUs per node"
            )
        return world_size // self.gpus_per_node


def default_net_efficiency(nic_bytes_per_s: float) -> float:
    """NCCL's usable share of one NIC: the largest ``NET_SPEED_STEPS_GBPS`` step at or below
    the NIC's rate, over that rate (1.0 with no NIC or one slower than every step)."""
    rate_gbps = nic_bytes_per_s / 1e9
    steps = [s for s in NET_SPEED_STEPS_GBPS if s <= rate_gbps]
    return max(steps) / rate_gbps if steps and rate_gbps > 0 else 1.0


_REQUIRED = (
    "name",
    "gpus_per_node",
    "intra_fabric",
    "intra_bytes_per_s",
    "intra_efficiency",
)
_DEFAULTS: dict[str, Any] = {
    "num_nodes": 1,
    "nics_per_node": 0,
    "nic_bytes_per_s": 0.0,
    "nvls": False,
    "ll128": True,
    "nic_path": "pxb",
    "gpu_generation": "other",
    "num_channels": None,
    "sources": (),
}
_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "description": (str,),
    "gpus_per_node": (int,),
    "num_nodes": (int,),
    "intra_fabric": (str,),
    "intra_bytes_per_s": (int, float),
    "intra_efficiency": (int, float),
    "nics_per_node": (int,),
    "nic_bytes_per_s": (int, float),
    "net_efficiency": (int, float),
    "nvls": (bool,),
    "ll128": (bool,),
    "nic_path": (str,),
    "gpu_generation": (str,),
    "num_channels": (int,),
    "sources": (list,),
}


def _from_mapping(entry: Any, origin: str, index: int) -> Cluster:
    if not isinstance(entry, dict):
        raise ValueError(f"{origin}: clusters[{index}] must be a mapping, got {entry!r}")
    label = f"{origin}: cluster {entry.get('name', index)!r}"
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{label} lacks the keys {missing}")
    known = {f.name for f in fields(Cluster)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"{label} has unknown keys {unknown}; known keys: {sorted(known)}")
    for key, value in entry.items():
        types = _TYPES[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise ValueError(f"{label}: {key} must be {names}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):  # named here, not derived
            raise ValueError(f"{label}: {key} must be a finite number, got {value!r}")
    values = {**_DEFAULTS, **entry}
    values.setdefault("description", str(values["name"]))
    values.setdefault("net_efficiency", default_net_efficiency(float(values["nic_bytes_per_s"])))
    sources = []
    for j, src in enumerate(values["sources"]):
        if (
            not isinstance(src, dict)
            or "figure" not in src
            or not set(src) <= {"figure", *_SOURCE_KEYS}
        ):
            raise ValueError(
                f"{label}: sources[{j}] must be a mapping with 'figure' and any of "
                f"{list(_SOURCE_KEYS)}, got {src!r}"
            )
        sources.append({k: str(v) for k, v in src.items()})
    values["sources"] = tuple(sources)
    for key in ("intra_bytes_per_s", "intra_efficiency", "nic_bytes_per_s", "net_efficiency"):
        values[key] = float(values[key])
    try:
        return Cluster(**values)
    except ValueError as err:
        raise ValueError(f"{origin}: {err}") from None


def _parse(text: str, origin: str) -> list[Cluster]:
    data = load_yaml(text, origin)
    if not isinstance(data, dict) or not isinstance(data.get("clusters"), list):
        raise ValueError(f"{origin}: expected a mapping with a 'clusters' list")
    if set(data) != {"clusters"}:
        raise ValueError(f"{origin}: unknown top-level keys {sorted(set(data) - {'clusters'})}")
    return [_from_mapping(entry, origin, i) for i, entry in enumerate(data["clusters"])]


def builtin_clusters() -> dict[str, Cluster]:
    """The cluster descriptions shipped with commprof, by name."""
    text = (
        resources.files("commprof.modeling.collective").joinpath("clusters.yaml").read_text("utf-8")
    )
    return {c.name: c for c in _parse(text, "clusters.yaml")}


def load_cluster(name_or_path: str | Path) -> Cluster:
    """A bundled cluster by name, or the only (or named) cluster of a user's YAML file.

    Args:
        name_or_path: A bundled name (``dgx-a100``) or a YAML file with a ``clusters:`` list.

    Returns:
        The cluster.
    """
    bundled = builtin_clusters()
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"--cluster {name_or_path!r} is neither a bundled cluster ({', '.join(sorted(bundled))})"  # noqa: E501
            " nor a file"
        )
    found = _parse(read_text(path, "the cluster file"), str(path))
    if len(found) != 1:
        raise ValueError(f"{path}: holds {len(found)} clusters; give a file with exactly one")
    return found[0]
