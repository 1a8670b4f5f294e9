"""The smoke sweep end to end on a real local Ray: gangs, real gloo DDP, the dataset, resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from commprof import matrix, results
from commprof.catalog import count_parameters
from commprof.sweeps.driver import Driver, DriverOptions

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def smoke(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """Run sweeps/smoke.yaml once for the module; yield (dataset folder, summary)."""
    out = tmp_path_factory.mktemp("smoke")
    summary = Driver(matrix.load(REPO / "sweeps" / "smoke.yaml"), DriverOptions(out=out)).run()
    return out, summary


def test_every_cell_completes(smoke: tuple[Path, object]) -> None:
    out, summary = smoke
    m = matrix.load(REPO / "sweeps" / "smoke.yaml")
    cells = results.load(out)["cells"]
    assert summary.ok == len(m.cells) and summary.failed == 0  # type: ignore[attr-defined]
    assert sorted(cells["cell_id"]) == sorted(c.cell_id for c in m.cells)
    assert (cells["status"] == "ok").all()
    assert (cells["attempt"] == 1).all()


def test_tables_load_with_pandas_and_ray_data(smoke: tuple[Path, object]) -> None:
    out, _ = smoke
    tables = results.load(out)
    for name in ("steps", "buckets", "bucket_params", "microbench", "hook_cost"):
        frame = tables[name]
        assert not frame.empty, name
        dataset = results.load_dataset(out, name)
        assert dataset.count() == len(frame), name
        assert set(dataset.schema().names) == set(frame.columns)
    assert (tables["microbench"]["num_wrong"] == 0).all()


def test_bucket_records_match_parameter_bytes(smoke: tuple[Path, object]) -> None:
    out, _ = smoke
    tables = results.load(out)
    cells = tables["cells"].set_index("cell_id")
    per_step = tables["buckets"].groupby(["cell_id", "rank", "step"])["num_bytes"].sum()
    for (cell_id, _rank, _step), total in per_step.items():
        fp32_bytes = 4
        assert total == count_parameters(cells.loc[cell_id, "model"]) * fp32_bytes
    # composition: every parameter in exactly one bucket, bytes adding up to the model's
    for cell_id, params in tables["bucket_params"].groupby("cell_id"):
        assert params["param_name"].is_unique
        assert params["num_bytes"].sum() == count_parameters(cells.loc[cell_id, "model"]) * 4


def test_steps_cover_every_rank_and_step(smoke: tuple[Path, object]) -> None:
    out, _ = smoke
    tables = results.load(out)
    m = matrix.load(REPO / "sweeps" / "smoke.yaml")
    by_id = {c.cell_id: c for c in m.cells}
    for cell_id, steps in tables["steps"].groupby("cell_id"):
        cell = by_id[cell_id]
        assert len(steps) == cell.world_size * cell.steps
        assert not steps[steps["step"] < max(1, cell.warmup_steps)]["measured"].any()
        assert steps[steps["step"] >= max(1, cell.warmup_steps)]["measured"].all()
        assert (steps["step_ns"] >= steps["forward_ns"] + steps["backward_ns"]).all()


def test_profiled_cells_have_trace_metrics_and_traces(smoke: tuple[Path, object]) -> None:
    out, _ = smoke
    tables = results.load(out)
    metrics = tables["trace_metrics"]
    m = matrix.load(REPO / "sweeps" / "smoke.yaml")
    assert sum(c.profile for c in m.cells) == 4  # half of the demo runs under the profiler
    for cell in m.cells:
        rows = metrics[metrics["cell_id"] == cell.cell_id]
        traces = sorted((out / "traces" / f"{cell.cell_id}-a1").glob("*.json.gz"))
        if not cell.profile:
            assert rows.empty and not traces
            continue
        first = max(1, cell.warmup_steps)
        # exactly the measured steps were traced, on every rank
        assert sorted(set(rows["step"])) == list(range(first, cell.steps))
        assert set(rows["rank"]) == set(range(cell.world_size))
        assert len(traces) == cell.world_size
    # docs/design.md, Definitions: compute + exposed + idle + other = window, exactly
    total = metrics["compute_ns"] + metrics["exposed_ns"] + metrics["idle_ns"] + metrics["other_ns"]
    assert (total == metrics["window_ns"]).all()
    assert (metrics["overlap_ns"] <= metrics["comm_ns"]).all()
    # every bucket of a traced step was found in the trace (matched by size)
    buckets = tables["buckets"]
    per_step = buckets.groupby(["cell_id", "rank", "step"]).size().rename("num_buckets")
    joined = metrics.join(per_step, on=["cell_id", "rank", "step"])
    assert (joined["num_collectives"] == joined["num_buckets"]).all()


def test_every_cell_measures_the_hooks_cost(smoke: tuple[Path, object]) -> None:
    out, _ = smoke
    rows = results.load(out)["hook_cost"]
    for cell in matrix.load(REPO / "sweeps" / "smoke.yaml").cells:
        mine = rows[rows["cell_id"] == cell.cell_id]
        assert len(mine) == cell.world_size * cell.hook_cost_pairs * 2  # a hooked, a plain step
        assert (mine.groupby(["rank", "pair"])["arm"].nunique() == 2).all()


def test_rerun_skips_complete_cells(smoke: tuple[Path, object]) -> None:
    out, _ = smoke
    before = results.load(out)
    summary = Driver(matrix.load(REPO / "sweeps" / "smoke.yaml"), DriverOptions(out=out)).run()
    after = results.load(out)
    assert summary.attempts == 0 and summary.skipped == len(before["cells"])
    for name in results.TABLES:
        assert len(after[name]) == len(before[name]), name


def test_resume_reruns_a_damaged_cell_and_keeps_its_files(
    smoke: tuple[Path, object], tmp_path: Path
) -> None:
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(smoke[0], out)
    cells = results.load(out)["cells"]
    victim = str(cells["cell_id"].iloc[0])
    steps_file = out / "steps" / f"{victim}-a1.parquet"
    data = bytearray(steps_file.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit
    steps_file.write_bytes(bytes(data))
    with pytest.raises(results.DamagedDataset, match=rf"steps/{victim}-a1\.parquet changed"):
        results.load(out)
    summary = Driver(matrix.load(REPO / "sweeps" / "smoke.yaml"), DriverOptions(out=out)).run()
    assert summary.ok == 1 and summary.skipped == len(cells) - 1  # only the damaged cell ran
    after = results.load(out)  # verified clean again
    rerun = after["cells"][after["cells"]["cell_id"] == victim]
    assert rerun[["attempt", "status"]].values.tolist() == [[2, "ok"]]
    (aside,) = (out / "damaged").iterdir()  # kept aside, never deleted
    assert (aside / "steps" / steps_file.name).read_bytes() == bytes(data)
    assert "changed since it was written" in (aside / "WHY.txt").read_text()
