"""The step-model benchmark's declared split (``benchmarks/step_model_split.yaml``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from step_model_split import SPLIT_FILE, load_split  # noqa: E402

GOOD = """\
world_size: 2
models:
  srn-1m:
    batch_size: 8
    pair_steps: 4
    calibration_cap_mb: 25
    held_out_caps_mb: [0.25, 1]
    held_out_world_sizes: [{world_size: 3, bucket_cap_mb: 25}]
"""


def test_the_committed_split_holds_the_new_cells() -> None:
    split = load_split(SPLIT_FILE)
    assert split.world_size == 2
    tiny = split.model("srn-100k")
    assert tiny.caps_mb == (0.05, 0.1, 0.25, 25.0)
    assert tiny.calibration_cap_mb == 25.0
    assert [(w.world_size, w.bucket_cap_mb) for w in split.model("srn-1m").held_out_worlds] == [
        (3, 25.0)
    ]


def test_a_valid_file_reads(tmp_path: Path) -> None:
    path = tmp_path / "split.yaml"
    path.write_text(GOOD)
    ms = load_split(path).model("srn-1m")
    assert ms.caps_mb == (0.25, 1.0, 25.0)
    assert ms.batch_size == 8 and ms.pair_steps == 4


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("[0.25, 1]", "[0.25, x]", r"models\.srn-1m\.held_out_caps_mb\[1\] must be a number.*'x'"),
        ("[0.25, 1]", "[0.25, 25]", r"leave out the calibration cap 25"),
        ("srn-1m:", "srn-1q:", r"models\.srn-1q: unknown model name"),
        ("batch_size: 8", "batch_size: 0", r"models\.srn-1m\.batch_size must be an integer >= 1"),
        ("world_size: 3", "world_size: 2", r"world_size 2 is the calibration world size"),
        ("    pair_steps: 4\n", "", r"missing \['pair_steps'\]"),
    ],
)
def test_errors_name_file_key_and_value(tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "split.yaml"
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(ValueError, match=message) as err:
        load_split(path)
    assert str(path) in str(err.value)


def test_the_committed_split_is_the_one_the_latest_run_collected_under() -> None:
    # the split is declared before a run: editing it (a comment included) after the run that
    # the committed result scores makes --analyze-only report another split, so it fails here
    import hashlib
    import json

    latest = json.loads((BENCHMARKS / "results" / "step_model.json").read_text())
    assert latest["split_as_collected"] == "same"
    assert hashlib.sha256(SPLIT_FILE.read_bytes()).hexdigest() == latest["split_sha256"]


UNSEEN_FILE = BENCHMARKS / "step_model_unseen.yaml"


def test_the_unseen_split_holds_no_configuration_of_the_committed_one() -> None:
    from commprof.catalog import parameter_sizes
    from commprof.modeling.buckets import assign_buckets

    committed, unseen = load_split(SPLIT_FILE), load_split(UNSEEN_FILE)
    assert not set(committed.names) & set(unseen.names)
    for ms in unseen.models:
        sizes = parameter_sizes(ms.name)
        layouts = [
            tuple(b.param_indices for b in assign_buckets(sizes, bucket_cap_mb=cap))
            for cap in ms.caps_mb
        ]
        assert len(set(layouts)) == len(layouts), f"{ms.name}: two caps bucket alike"
        for world in ms.held_out_worlds:  # both a new world size and a new cap
            assert world.bucket_cap_mb != ms.calibration_cap_mb
    assert {w.world_size for ms in unseen.models for w in ms.held_out_worlds} == {3, 4}


def test_a_run_is_named_after_its_split(tmp_path: Path) -> None:
    from bench_step_model import result_name

    assert result_name(SPLIT_FILE) == "step_model"
    assert result_name(UNSEEN_FILE) == "step_model_unseen"
    assert result_name(tmp_path / "mine.yaml") == "step_model_mine"
    assert result_name(tmp_path / "step_model.yaml") == "step_model_step_model"


def test_the_unseen_split_is_the_one_its_latest_run_collected_under() -> None:
    import hashlib
    import json

    latest = json.loads((BENCHMARKS / "results" / "step_model_unseen.json").read_text())
    assert latest["split_as_collected"] == "same"
    assert hashlib.sha256(UNSEEN_FILE.read_bytes()).hexdigest() == latest["split_sha256"]
