"""The scale splits of the collective benchmark (benchmarks/collective_scale_split.yaml, the
second and third held-out sets, collective_scale_split_2.yaml and _3.yaml): each system
calibrates on its smallest one or two nodes and predicts only larger world sizes; logs with a
licence are committed, those without are not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from commprof.modeling.collective.calibration import calibrate
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.collectives import COLLECTIVES
from commprof.modeling.collective.nccl_tests import read_log
from commprof.yamlio import load_yaml, read_text

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ROOT / "benchmarks" / "collective_scale_split.yaml"
SPLIT_2 = ROOT / "benchmarks" / "collective_scale_split_2.yaml"
SPLIT_3 = ROOT / "benchmarks" / "collective_scale_split_3.yaml"
DATA = ROOT / "tests" / "data" / "nccl_tests"
SYSTEMS = load_yaml(read_text(SPLIT, "the split"), str(SPLIT))["systems"]
SYSTEMS_2 = load_yaml(read_text(SPLIT_2, "the split"), str(SPLIT_2))["systems"]
SYSTEMS_3 = load_yaml(read_text(SPLIT_3, "the split"), str(SPLIT_3))["systems"]


@pytest.mark.parametrize(
    "system",
    SYSTEMS + SYSTEMS_2 + SYSTEMS_3,
    ids=[s["name"] for s in SYSTEMS]
    + [s["name"] + "-2" for s in SYSTEMS_2]
    + [s["name"] + "-3" for s in SYSTEMS_3],
)
def test_each_system_calibrates_on_one_or_two_nodes_and_predicts_larger(system: dict) -> None:
    cluster = load_cluster(system["cluster"])
    assert system["role"] in ("development", "held_out")
    assert system["collective"] in COLLECTIVES
    sizes = {int(p) for p in system["logs"]}
    cal, pred = set(system["calibrate"]), set(system["predict"])
    assert cal and pred and cal | pred <= sizes and not cal & pred
    assert max(cluster.nodes_for(p) for p in cal) <= 2
    assert min(pred) > max(cal)
    for path in system["logs"].values():
        committed = (DATA / path).is_file()
        assert committed == (system["licence"] != "none"), path


def test_names_are_unique_and_the_roles_both_present() -> None:
    names = [s["name"] for s in SYSTEMS]
    assert len(set(names)) == len(names)
    assert {s["role"] for s in SYSTEMS} == {"development", "held_out"}


@pytest.mark.parametrize("later", [SYSTEMS_2, SYSTEMS_3], ids=["second", "third"])
def test_each_later_set_is_held_out_and_new(later: list[dict]) -> None:
    # only systems the earlier splits do not use; nothing there chooses anything (the third set
    # is empty: no system of its search was measured at two whole-node world sizes)
    assert {s["role"] for s in later} <= {"held_out"}
    earlier = [s for s in SYSTEMS + SYSTEMS_2 if s not in later]
    first = {(s["name"], path) for s in earlier for path in s["logs"].values()}
    assert not {s["name"] for s in later} & {name for name, _ in first}
    assert not {p for s in later for p in s["logs"].values()} & {p for _, p in first}


ONE_SIZE = load_yaml(read_text(SPLIT_3, "the split"), str(SPLIT_3))["in_sample_only"]


@pytest.mark.parametrize("entry", ONE_SIZE, ids=[e["name"] for e in ONE_SIZE])
def test_each_one_size_system_is_new_and_within_two_nodes(entry: dict) -> None:
    # the third split's logs of one world size: scored in sample and by the description alone
    assert set(entry) == {"name", "cluster", "collective", "licence", "world_size", "log"}
    assert entry["collective"] in COLLECTIVES
    assert load_cluster(entry["cluster"]).nodes_for(int(entry["world_size"])) <= 2
    assert (DATA / entry["log"]).is_file() == (entry["licence"] != "none"), entry["log"]
    used = {p for s in SYSTEMS + SYSTEMS_2 + SYSTEMS_3 for p in s["logs"].values()}
    assert entry["log"] not in used
    assert [e["name"] for e in ONE_SIZE].count(entry["name"]) == 1


def test_a_log_of_another_collective_is_refused() -> None:
    # a broadcast log (its header names the test) given as all_reduce: refused, file named
    log = read_log(DATA / "abci-a100" / "broadcast_p8.txt")
    log = replace(log, runs=(replace(log.run, collective="broadcast"),))
    cluster = load_cluster("abci-a100")
    assert calibrate(cluster, [log], "broadcast").calibrated_nodes == 1
    with pytest.raises(
        ValueError, match=r"broadcast_p8\.txt: is a log of broadcast, not all_reduce"
    ):
        calibrate(cluster, [log])
