"""A cell whose DDP bucket cap is left unset (``bucket_cap_mb: null``): DDP's own default.

DDP's default differs from an explicit 25 MiB: its first bucket is capped at 1 MiB, an explicit
cap caps the first bucket too. One real 2-rank gloo run of srn-1m (about 4 MB of gradients)
shows it, then the cell goes through the dataset, the analysis and the report's figures and
macros, where the unset cap must stay visible instead of being dropped as NaN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from commprof import flags, matrix, results
from commprof.analysis.dataset import load_processed
from commprof.catalog import parameter_sizes
from commprof.matrix import Cell
from commprof.modeling.buckets import assign_buckets
from commprof.reporting import figures, main_sections, prose
from commprof.sweeps.guard import GuardPlan
from commprof.training.launcher import run_local
from tests.hang import GUARD_S

CELL = Cell(
    model="srn-1m",
    world_size=2,
    bucket_cap_mb=None,
    steps=3,
    warmup_steps=1,
    batch_size=2,
    microbench_sizes_bytes=(4096,),
    microbench_iters=2,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("default-cap")
    per_rank = run_local(CELL, timeout_s=120, limit_s=GUARD_S)
    results.commit_attempt(
        out, CELL, per_rank=per_rank, sweep="t", attempt=1, num_params=1, wall_s=1.0
    )
    return out, per_rank


def test_a_matrix_can_leave_the_cap_unset(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        "axes:\n  model: [srn-1m]\n  world_size: [2]\n  bucket_cap_mb: [null, 25]\n"
    )
    unset, explicit = matrix.load(tmp_path / "m.yaml").cells
    assert unset.bucket_cap_mb is None and explicit.bucket_cap_mb == 25.0
    assert unset.cell_id != explicit.cell_id  # different first-bucket caps: two configurations
    assert matrix.cell_from_config(unset.config()) == unset
    assert GuardPlan().decide(unset).feasible
    (tmp_path / "bad.yaml").write_text(
        "axes:\n  model: [srn-1m]\n  world_size: [2]\n  bucket_cap_mb: [fast]\n"
    )
    with pytest.raises(matrix.MatrixError, match="expected int or float or null"):
        matrix.load(tmp_path / "bad.yaml")
    with pytest.raises(matrix.MatrixError, match="or null"):
        Cell(model="srn-1m", world_size=2, bucket_cap_mb=0)


@pytest.mark.slow
def test_ddp_runs_its_default_cap(dataset: tuple[Path, list[dict[str, Any]]]) -> None:
    _, per_rank = dataset
    sizes = parameter_sizes(CELL.model)
    predicted = [b.num_bytes for b in assign_buckets(sizes, bucket_cap_mb=None)]
    assert len(predicted) > len(assign_buckets(sizes, bucket_cap_mb=25.0)) == 1
    for result in per_rank:
        rebuilt = [b for b in result["records"]["buckets"] if b["step"] == 1]
        assert sorted(b["num_bytes"] for b in rebuilt) == sorted(predicted)


@pytest.mark.slow
def test_unset_cap_stays_visible_in_analysis_and_report(
    dataset: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    out, _ = dataset
    cells = results.load(out)["cells"]
    assert cells["bucket_cap_mb"].isna().all()  # null in the table, as in the config
    assert (cells["load_avg_1m"] >= 0).all()  # rank 0 read the host's load when training ended
    data = load_processed(out)
    assert len(data.merged) == 1 and data.merged["bucket_cap_mb"].isna().all()
    assert data.summary["allreduce_sum_modelled_ns"].notna().all()  # modelled with DDP's caps
    made = figures.make_all(data, tmp_path)
    assert [r.name for r in made] == list(figures.FIGURES)
    assert all((tmp_path / f"{r.name}.png").is_file() for r in made if r.written)
    quotes = prose.Quotes()
    assert "bucket cap DDP~default (Table" in main_sections.abstract(data, quotes)
    assert "cap DDP~default" in main_sections.findings(data, quotes, set()).body


def test_commprof_run_flag_can_leave_the_cap_unset(capsys: pytest.CaptureFixture[str]) -> None:
    from commprof import cli

    assert flags.cap("default") is None and flags.cap("0.5") == 0.5
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--out", "x"]
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--bucket-cap-mb", "fast"])
    assert info.value.code == 2
    assert "'fast' is not a number of MiB or 'default'" in capsys.readouterr().err
