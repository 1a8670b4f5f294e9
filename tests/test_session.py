"""commprof.attach in the user's own training: the README example under torchrun, and a model
outside the catalog under the user's own mp.spawn, both real 2-rank gloo runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from commprof import results
from commprof.training.session import AttachConfig
from tests.hang import GUARD_S
from tests.test_in_sample import assert_reproduces

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_HEADING = "## Your own training"
STEPS = 8
"""Training steps of the README example and of the spawned test."""


def readme_example() -> str:
    """The first fenced python block after docs/usage.md's heading for commprof.attach (the
    README links there)."""
    text = (REPO / "docs" / "usage.md").read_text()
    section = text[text.index(EXAMPLE_HEADING) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python block under the README heading"
    return match.group(1)


def _env() -> dict[str, str]:
    # This checkout's code wins over any installed commprof; gloo over loopback on one machine.
    return {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}


@pytest.mark.slow
def test_readme_example_runs_under_torchrun_and_its_dataset_reads(tmp_path: Path) -> None:
    from commprof.modeling.collective.dataset_fits import fits_from_dataset
    from commprof.traces.analyze import analyze_dir

    code = readme_example()
    assert len(code.splitlines()) <= 25, "the README example grew past 25 lines"
    (tmp_path / "example.py").write_text(code)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*torchrun, "--nproc_per_node", "2", "example.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "commprof-run"
    tables = results.load(out)
    (cell,) = tables["cells"].itertuples(index=False)
    assert (cell.status, cell.sweep, cell.model, cell.world_size) == (
        "ok",
        "attach",
        "Sequential",
        2,
    )
    assert (cell.backend, cell.device, cell.bucket_cap_mb, cell.regime) == (
        "gloo",
        "cpu",
        0.1,
        "cpu-gloo",
    )
    num_params = (64 * 512 + 512) + (512 * 96 + 96) + (96 * 10 + 10)
    assert cell.num_params == num_params
    assert json.loads(cell.env_json)["torch"].startswith("2.")
    steps = tables["steps"]
    assert len(steps) == 2 * STEPS and sorted(set(steps["step"])) == list(range(STEPS))
    assert list(steps.groupby("rank")["measured"].sum()) == [STEPS - 1, STEPS - 1]
    assert (steps["step_ns"] > 0).all()
    phases = steps["forward_ns"] + steps["backward_ns"] + steps["optimizer_ns"]
    assert (phases == steps["step_ns"]).all()  # the three phases tile the step exactly
    # every step's buckets hold every gradient exactly once: 4 bytes a float32 parameter
    per_step = tables["buckets"].groupby(["rank", "step"])["num_bytes"].sum()
    assert (per_step == 4 * num_params).all() and len(per_step) == 2 * STEPS
    assert tables["bucket_params"]["numel"].sum() == num_params
    assert set(tables["microbench"]["source"]) == {"sizes", "bucket"}

    trace_dir = out / "traces" / f"{cell.cell_id}-a1"
    assert sorted(p.name for p in trace_dir.iterdir()) == [
        "rank0_steps2-4.json.gz",
        "rank1_steps2-4.json.gz",
    ]
    analyzed = analyze_dir(trace_dir)["steps"]  # what `commprof analyze` prints
    assert sorted(set(zip(analyzed["rank"], analyzed["step"], strict=True))) == [
        (r, s) for r in (0, 1) for s in (2, 3, 4)
    ]
    assert len(tables["trace_metrics"]) == 2 * 3
    fits = fits_from_dataset(out)  # what `commprof estimate --fit` fits
    assert list(fits) == [("gloo", "cpu-gloo", 2)]
    assert_reproduces(out, "Sequential", 2)  # the step model of an attach run
    _builds_report(out)


def _builds_report(out: Path) -> None:
    """`commprof report` on the folder: the PDFs where LaTeX is installed, else the sources."""
    from commprof.reporting.build import report_main

    assert report_main(out, None) in (0, 1)
    report = out / "report"
    assert (report / "latex" / "main.tex").is_file()
    # one configuration: the figures of one cell (no cap or world-size comparison to draw)
    for stem in ("step_breakdown", "layer_attribution"):
        assert (report / "figures" / f"{stem}.pdf").is_file(), stem
    if shutil.which("latexmk"):
        assert (report / "main.pdf").stat().st_size > 0
        assert (report / "postmortem.pdf").stat().st_size > 0


# -- the user's own mp.spawn, a model outside the catalog ----------------------------------------


def _conv_net() -> Any:
    """A small conv net with uneven layers (not a catalog model)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 5, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(5, 7, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(7 * 6 * 6, 33),
        nn.ReLU(),
        nn.Linear(33, 10),
    )


class CountingState:
    """The user's own comm-hook state: the process group and a call count."""

    def __init__(self) -> None:
        self.calls = 0


def counting_allreduce(state: CountingState, bucket: Any) -> Any:
    """The user's own comm hook: DDP's all-reduce, counting its calls."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    state.calls += 1
    return default_hooks.allreduce_hook(None, bucket)


# DDP checks a hook's annotations against the real types; postponed ones are strings.
counting_allreduce.__annotations__ = {}


def _user_rank(rank: int, world_size: int, tmp: str) -> None:  # pragma: no cover - child
    """What a user's spawned rank does: two pairs of identical models, one of each pair with
    commprof attached (with DDP's default hook, and with the user's own hook)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import commprof

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(tmp, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        models = []
        for _ in range(4):
            torch.manual_seed(0)
            models.append(DDP(_conv_net(), bucket_cap_mb=0.01))
        plain, attached, hooked, attached_hooked = models
        direct_state, wrapped_state = CountingState(), CountingState()
        hooked.register_comm_hook(direct_state, counting_allreduce)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
        max_diff = 0.0
        with (
            commprof.attach(attached, os.path.join(tmp, "default-hook")) as a,
            commprof.attach(
                attached_hooked,
                os.path.join(tmp, "user-hook"),
                comm_hook=counting_allreduce,
                comm_state=wrapped_state,
                microbench_iters=0,
            ) as b,
        ):
            for step in range(STEPS):
                # rank-dependent inputs: the all-reduce has work to do
                gen = torch.Generator().manual_seed(100 * rank + step)
                x = torch.randn(4, 3, 8, 8, generator=gen) ** (1 + rank)
                y = torch.randint(0, 10, (4,), generator=gen)
                for model, opt in zip(models, optimizers, strict=True):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                for one, other in ((plain, attached), (hooked, attached_hooked)):
                    for p, q in zip(one.parameters(), other.parameters(), strict=True):
                        max_diff = max(max_diff, float((p.grad - q.grad).abs().max()))
                for opt in optimizers:
                    opt.step()
                a.step()
                b.step()
        params_equal = all(
            torch.equal(p, q)
            for one, other in ((plain, attached), (hooked, attached_hooked))
            for p, q in zip(one.parameters(), other.parameters(), strict=True)
        )
        report = {
            "max_grad_diff": max_diff,
            "params_equal": params_equal,
            "direct_calls": direct_state.calls,
            "wrapped_calls": wrapped_state.calls,
            "cell_ids": [a.cell_id, b.cell_id],
        }
        Path(tmp, f"rank{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    finally:
        dist.destroy_process_group()


USER_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
from test_session import _user_rank
_user_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["mp.spawn", "torchrun"])
def test_user_conv_net_gradients_unchanged_and_dataset_reads(launcher: str, tmp_path: Path) -> None:
    if launcher == "mp.spawn":
        import torch.multiprocessing as mp

        mp.spawn(_user_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    else:
        script = tmp_path / "user_train.py"
        script.write_text(USER_SCRIPT.format(tests=str(Path(__file__).parent)))
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        done = subprocess.run(
            [*torchrun, "--nproc_per_node", "2", str(script), str(tmp_path)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=GUARD_S,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert report["max_grad_diff"] == 0.0  # atol=0: the hook never touches gradients
        assert report["params_equal"]
        # the user's hook ran for every bucket, wrapped as directly
        assert report["wrapped_calls"] == report["direct_calls"] > STEPS
    assert reports[0]["cell_ids"] == reports[1]["cell_ids"]  # every rank learns the cell id

    num_params = (3 * 5 * 9 + 5) + (5 * 7 * 9 + 7) + (7 * 6 * 6 * 33 + 33) + (33 * 10 + 10)
    for folder, hook in (("default-hook", "allreduce_hook"), ("user-hook", "counting_allreduce")):
        tables = results.load(tmp_path / folder)
        (cell,) = tables["cells"].itertuples(index=False)
        assert (cell.status, cell.model, cell.hook, cell.num_params) == (
            "ok",
            "Sequential",
            hook,
            num_params,
        )
        assert cell.bucket_cap_mb == 0.01 and cell.steps == STEPS
        per_step = tables["buckets"].groupby(["rank", "step"])["num_bytes"].sum()
        assert (per_step == 4 * num_params).all() and len(per_step) == 2 * STEPS
        assert tables["buckets"]["num_bytes"].nunique() > 1  # several buckets, as capped
    assert results.load(tmp_path / "user-hook")["microbench"].empty  # microbench_iters=0
    user = results.load(tmp_path / "user-hook")["buckets"]
    assert len(user) == sum(r["wrapped_calls"] for r in reports)
    if launcher == "torchrun":  # the report once (its build takes seconds)
        _builds_report(tmp_path / "default-hook")


@pytest.mark.slow
def test_a_second_run_of_the_same_configuration_is_a_repeat(tmp_path: Path) -> None:
    """The folder keeps both runs: the same configuration gets repeat 1 and its own id."""
    (tmp_path / "one.py").write_text(_ONE_RANK)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [*torchrun, "--nproc_per_node", "1", "one.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cells = results.load(tmp_path / "commprof-run")["cells"].sort_values("repeat")
    assert list(cells["repeat"]) == [0, 1] and cells["cell_id"].nunique() == 2
    configs = [{**json.loads(c), "repeat": None} for c in cells["config_json"]]
    assert configs[0] == configs[1]


_ONE_RANK = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import commprof
dist.init_process_group("gloo")
for _ in range(2):  # the same configuration twice
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    with commprof.attach(model, microbench_iters=0) as run:
        for _ in range(3):
            model(torch.ones(2, 8)).sum().backward()
            run.step()
    del model
dist.destroy_process_group()
"""


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"profile_steps": range(3, 3)}, "profile_steps must be a non-empty range"),
        ({"profile_steps": range(0, 6, 2)}, "consecutive"),
        ({"profile_steps": [2, 3]}, "range"),
        ({"profile_steps": range(5, 20), "max_steps": 10}, "within the recorded steps"),
        ({"max_steps": 1}, "max_steps must be an int >= 2"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"microbench_iters": -1}, "microbench_iters"),
        ({"microbench_sizes_bytes": (0,)}, "microbench_sizes_bytes"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_attach_settings_checked_before_anything_runs(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        AttachConfig(out=Path("unused"), **settings)


def test_attach_names_what_to_wrap() -> None:
    import torch

    import commprof

    with pytest.raises(TypeError, match="DistributedDataParallel"):
        commprof.attach(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
