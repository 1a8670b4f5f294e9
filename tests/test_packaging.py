"""The installed shape of the package: what each entry point loads, and the one commit path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from commprof import cli, results

REPO = Path(__file__).resolve().parent.parent
HELP = "from commprof.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"


def _loaded(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``code`` (from outside)."""
    found = f"[m for m in {modules!r} if m in sys.modules]"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({found}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("code", "absent"),
    [
        ("import commprof.analysis.dataset, commprof.reporting.build", ("torch", "ray")),
        ("import commprof.sweeps.driver", ("torch",)),
        ("import commprof.traces.analyze", ("torch", "ray")),
        (HELP, ("torch", "ray", "pandas", "scipy")),
        ("import commprof", ("torch", "ray", "pandas")),  # commprof.attach loads on first use
    ],
    ids=[
        "analysis-and-reporting",
        "sweep-driver",
        "trace-analysis",
        "commprof-help",
        "import-commprof",
    ],
)
def test_entry_points_leave_heavy_modules_out(code: str, absent: tuple[str, ...]) -> None:
    assert _loaded(code, absent) == []


def test_subpackages_resolve_to_the_repository_folders() -> None:
    import commprof.actors.gang
    import commprof.reporting.build
    import commprof.sweeps.driver

    assert Path(commprof.sweeps.driver.__file__).parent == REPO / "sweeps"
    assert Path(commprof.actors.gang.__file__).parent == REPO / "actors"
    assert commprof.reporting.build.TEMPLATES.joinpath("main.tex").is_file()


def test_bundled_matrix_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from commprof.sweeps.run_matrix import BUNDLED, matrix_path

    monkeypatch.chdir(tmp_path)
    assert matrix_path("smoke") == BUNDLED / "smoke.yaml"
    (tmp_path / "smoke").write_text("name: mine\n")
    assert matrix_path("smoke") == Path("smoke")  # a file of that name wins
    assert matrix_path("nosuch") == Path("nosuch")  # left for the loader to name


@pytest.mark.slow
def test_run_commits_like_the_driver(tmp_path: Path) -> None:
    """``commprof run`` writes the cells columns the driver writes (one commit path)."""
    out = tmp_path / "ds"
    argv = ["run", "--model", "srn-100k", "--world-size", "2", "--steps", "3", "--out", str(out)]
    assert cli.main(argv) == 0
    cells = results.load(out)["cells"]
    assert len(cells) == 1
    row = cells.iloc[0]
    assert row["status"] == "ok"
    assert 0 < row["rank_wall_s"] <= row["wall_s"]
    assert row["nodes"] and row["guard_json"] and row["env_json"]
    assert cli.main(argv) == 0  # complete: not run again
    assert len(results.load(out)["cells"]) == 1


def test_check_reads_a_bundled_matrix_from_any_folder() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "commprof", "check", "smoke", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    report = json.loads(out.stdout)
    assert report["matrix"]["name"] == "smoke"
    # two models x two caps, with and without the profiler
    assert report["matrix"]["num_cells"] == 8 == len(report["matrix"]["cells"])
    assert report["matrix"]["estimate_s"] > 0
    assert {c["reason"] for c in report["matrix"]["cells"]} == {"feasible"}


@pytest.mark.slow
def test_check_prints_counts_and_lists_cells_on_request() -> None:
    def check(*flags: str) -> list[str]:
        cmd = [sys.executable, "-m", "commprof", "check", "smoke", *flags]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()

    summary = check()
    assert "       8 feasible" in summary and not any("srn-1m ws=2" in s for s in summary)
    listed = check("--cells")
    assert sum("srn-1m ws=2" in line for line in listed) == 4
