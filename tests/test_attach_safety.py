"""commprof.attach where the ranks or the folder misbehave: real 2-rank gloo runs, each scenario
in its own processes (spawned by a child Python, killed if it hangs), real dataset folders.

- ranks that run different step counts, or call ``run.step()`` differently, fail with the end
  agreement's error naming the ranks and their counts (without it both ranks waited in
  mismatched collectives for the process group's timeout, 30 minutes: past HANG_LIMIT_S);
- a run with no measured step is an error on every rank, and nothing is written;
- a folder held by another writer: attach waits (``wait_lock``), and where the folder stays held
  keeps the run in a side folder it names on every rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from commprof import results
from commprof.lock import DatasetLock

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
STEPS = 6
"""Training steps of rank 0 in every scenario."""
HANG_LIMIT_S = 600
"""A scenario still running after this long hangs: the test kills it and fails (a third of
torch's default process-group timeout, which a missing agreement would wait out)."""


def _rank(rank: int, tmp: str, scenario: dict[str, Any]) -> None:  # pragma: no cover - child
    """One rank of a user's training with commprof attached, as a scenario bends it; writes what
    happened to ``rank<N>.json`` and leaves with ``os._exit`` (so that the launcher does not
    kill the other rank before it has written its own)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import commprof

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    report: dict[str, Any] = {"rank": rank}
    run: Any = None
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = STEPS + (scenario.get("extra_steps", 0) if rank == 1 else 0)
        every = scenario.get("step_every", 1) if rank == 1 else 1
        calls = 0 if scenario.get("no_step_calls") else 1
        settings = {"microbench_iters": 0, "wait_lock": scenario.get("wait_lock", 0)}
        with commprof.attach(model, os.path.join(tmp, "out"), **settings) as run:
            for i in range(steps):
                x = torch.randn(8, 16) * (1 + rank)
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                if calls and i % every == every - 1:
                    run.step()
        report["outcome"] = "ok"
    except BaseException as err:
        report.update(outcome=type(err).__name__, error=str(err), side=getattr(err, "side", None))
    report["cell_id"] = getattr(run, "cell_id", None)
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(report))
    os._exit(0)


SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import torch.multiprocessing as mp
from test_attach_safety import _rank
mp.spawn(_rank, args=(sys.argv[1], json.loads(sys.argv[2])), nprocs=2, join=True)
"""


def _scenario(tmp_path: Path, **scenario: Any) -> list[dict[str, Any]]:
    """Run one scenario; its two ranks' reports."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
    code = SCRIPT.format(tests=str(Path(__file__).parent))
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), json.dumps(scenario)],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_LIMIT_S,  # a hang fails the test here instead of holding the suite
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ranks_that_run_different_step_counts_fail_naming_the_counts(tmp_path: Path) -> None:
    reports = _scenario(tmp_path, extra_steps=2)
    rank0, rank1 = reports
    # rank 0 ended after STEPS steps; rank 1 went on into a step whose all-reduce rank 0 never
    # joins: both raise the agreement's verdict, naming the ranks and the counts (without it,
    # both waited in the collective for the process group's timeout, past HANG_LIMIT_S)
    assert rank0["outcome"] == rank1["outcome"] == "RanksDisagree", reports
    for report in reports:
        assert f"rank 0 ended after {STEPS} run.step() calls" in report["error"], report
        assert "rank 1 went on past the end of rank 0" in report["error"], report
    assert not (tmp_path / "out" / "cells").exists()  # nothing written


def test_a_rank_that_calls_step_every_other_iteration_fails(tmp_path: Path) -> None:
    reports = _scenario(tmp_path, step_every=2)
    for report in reports:
        assert report["outcome"] == "RanksDisagree", report
        assert "ranks disagree on the run" in report["error"]
        # both counts named: rank 0's 6 calls and rank 1's 3, each with 6 steps' buckets
        assert f"{STEPS} run.step() calls" in report["error"]
        assert f"{STEPS // 2} run.step() calls" in report["error"]
    assert not (tmp_path / "out" / "cells").exists()


def test_a_run_with_no_step_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    reports = _scenario(tmp_path, no_step_calls=True)
    for report in reports:
        assert report["outcome"] == "ValueError", report
        assert "recorded 0 step(s) and none measured" in report["error"]
    assert not (tmp_path / "out" / "cells").exists()


def test_a_held_folder_keeps_the_run_in_a_side_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with DatasetLock(out):  # a sweep holds the folder for longer than the run waits
        reports = _scenario(tmp_path, wait_lock=1)
    sides = {report["side"] for report in reports}
    assert len(sides) == 1 and None not in sides, reports  # every rank names the same folder
    side = Path(sides.pop())
    assert side.parent == tmp_path and side.name.startswith("out.unsaved-")
    for report in reports:
        assert report["outcome"] == "RunNotCommitted"
        assert f"{out} did not take the run" in report["error"]
        assert f"is in use by another driver: pid {os.getpid()}" in report["error"]
        assert f"kept in {side}" in report["error"] and "\n" not in report["error"]
    assert not (out / "cells").exists()  # the held folder is untouched
    tables = results.load(side)  # nothing lost: the run reads from the side folder
    (cell,) = tables["cells"].itertuples(index=False)
    assert cell.status == "ok" and cell.cell_id == reports[0]["cell_id"]
    assert len(tables["steps"]) == 2 * STEPS


def test_attach_waits_for_a_held_folder(tmp_path: Path) -> None:
    import threading

    out = tmp_path / "out"
    lock = DatasetLock(out)
    lock.acquire()
    threading.Timer(3.0, lock.release).start()  # the other writer finishes while attach waits
    reports = _scenario(tmp_path, wait_lock=60)
    for report in reports:
        assert report["outcome"] == "ok", report
    (cell,) = results.load(out)["cells"].itertuples(index=False)
    assert cell.cell_id == reports[0]["cell_id"] == reports[1]["cell_id"]
    assert not list(tmp_path.glob("out.unsaved-*"))
