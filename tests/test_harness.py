"""Profiler harness: schedule, file naming, compressed atomic export, real 2-rank gloo run."""

from __future__ import annotations

import gzip
import importlib
import json
import re
from pathlib import Path

import pytest
import torch

from commprof.profiling.harness import HarnessConfig, profiled
from commprof.traces.trace_parser import parse_trace

MAKE_GOLDEN = Path(__file__).parent / "data" / "make_golden.py"


def train(prof: object, num_steps: int) -> None:
    model = torch.nn.Linear(8, 4)
    for _ in range(num_steps):
        model(torch.randn(2, 8)).sum().backward()
        prof.step()  # type: ignore[attr-defined]


def step_ids(path: Path) -> list[int]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    names = (e.get("name", "") for e in events if e.get("ph") == "X")
    return sorted(int(m.group(1)) for n in names if (m := re.match(r"ProfilerStep#(\d+)$", n)))


def test_schedule_names_and_atomic_gzip_export(tmp_path: Path) -> None:
    # Cycle of 1 wait + 1 warm-up + 2 active, twice: active steps 2-3 and 6-7.
    with profiled(tmp_path, rank=3, wait=1, warmup=1, active=2, repeat=2) as prof:
        train(prof, 9)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rank3_steps2-3.json.gz", "rank3_steps6-7.json.gz"]  # no temp files left
    assert [p.name for p in prof.trace_paths] == names
    assert step_ids(tmp_path / names[0]) == [2, 3]
    assert step_ids(tmp_path / names[1]) == [6, 7]
    parsed = parse_trace(tmp_path / names[0])
    assert parsed.rank == 3 and parsed.step_ids.tolist() == [2, 3]


def test_exit_mid_cycle_exports_the_partial_range(tmp_path: Path) -> None:
    with profiled(
        tmp_path,
        rank=0,
        wait=0,
        warmup=1,
        active=3,
        repeat=1,
        name_template="t_{rank}_{first}_{last}.json.gz",
    ) as prof:
        train(prof, 3)  # active steps would be 1-3; the block ends during step 3
    assert [p.name for p in prof.trace_paths] == ["t_0_1_3.json.gz"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"active": 0}, "active"),
        ({"wait": -1}, "wait"),
        ({"name_template": "r{rank}.json"}, "name_template"),
        ({"name_template": "r{oops}.json.gz"}, "name_template"),
    ],
)
def test_config_validation(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        HarnessConfig(rank=0, **kwargs)  # type: ignore[arg-type]


@pytest.mark.slow
def test_two_gloo_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spawned ranks unpickle make_golden.worker by module name: make it importable.
    monkeypatch.syspath_prepend(str(MAKE_GOLDEN.parent))
    make_golden = importlib.import_module("make_golden")
    make_golden.make_traces(tmp_path)
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}_steps2-4.json.gz"
        assert path.stat().st_size < 200_000
        parsed = parse_trace(path)
        assert (parsed.rank, parsed.world_size, parsed.regime) == (rank, 2, "cpu-gloo")
        assert parsed.collectives.groupby("step").size().tolist() == [3, 3, 3]
