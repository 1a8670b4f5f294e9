"""``--only`` / ``--exclude`` compare typed values (commprof.sweeps.plan); an empty term and a
selection of nothing are errors, said before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from commprof import matrix
from commprof.sweeps import run_matrix
from commprof.sweeps.plan import select

MATRIX = """name: sel
axes:
  model: [srn-100k]
  world_size: [2]
  bucket_cap_mb: [1, 2.5, null]
  batch_size: [8, 16]
"""


@pytest.fixture
def cells(tmp_path: Path) -> tuple[matrix.Cell, ...]:
    path = tmp_path / "sel.yaml"
    path.write_text(MATRIX)
    return matrix.load(path).cells


def _caps(chosen: list[matrix.Cell]) -> list[tuple[float | None, int]]:
    return sorted(((c.bucket_cap_mb, c.batch_size) for c in chosen), key=str)


@pytest.mark.parametrize(
    ("only", "exclude", "expected"),
    [
        # the stored cap is 1.0: the term's 1 is the same number (it selected 0 cells before)
        (["bucket_cap_mb=1"], [], [(1.0, 8), (1.0, 16)]),
        (["bucket_cap_mb=1.0"], [], [(1.0, 8), (1.0, 16)]),
        (["bucket_cap_mb=25e-1"], [], [(2.5, 8), (2.5, 16)]),
        (["bucket_cap_mb=null"], [], [(None, 8), (None, 16)]),
        (["bucket_cap_mb=~"], [], [(None, 8), (None, 16)]),
        (["bucket_cap_mb=default"], [], [(None, 8), (None, 16)]),  # the command line's word
        (["batch_size=16"], ["bucket_cap_mb=null"], [(1.0, 16), (2.5, 16)]),
        (["batch_size=8"], ["bucket_cap_mb=1", "bucket_cap_mb=2.5"], [(None, 8)]),
        (["world_size=2", "regime=cpu-gloo"], ["batch_size=8"], [(1.0, 16), (2.5, 16), (None, 16)]),
    ],
)
def test_terms_compare_typed_values(
    cells: tuple[matrix.Cell, ...], only: list[str], exclude: list[str], expected: list[object]
) -> None:
    assert _caps(select(cells, tuple(only), tuple(exclude))) == sorted(expected, key=str)


@pytest.mark.parametrize(
    ("term", "profiled"),
    [("profile=true", True), ("profile=yes", True), ("profile=On", True), ("profile=no", False)],
)
def test_booleans_match_their_yaml_spellings(term: str, profiled: bool) -> None:
    cells = tuple(
        matrix.Cell(model="srn-100k", world_size=2, bucket_cap_mb=1, profile=p) for p in (1, 0)
    )
    assert [c.profile for c in select(cells, (term,), ())] == [profiled]


def test_a_cell_id_prefix_selects_its_cell(cells: tuple[matrix.Cell, ...]) -> None:
    assert select(cells, (cells[3].cell_id[:6],), ()) == [cells[3]]


@pytest.mark.parametrize(
    ("only", "exclude", "said"),
    [
        ([], [""], "--exclude '': an empty term"),  # dropped every cell before
        ([" "], [], "an empty term"),
        (["bucket_cap_mb="], [], "no value after '='"),
        (["bucket_cap_mb=7"], [], "selects none of the matrix's 6 cells"),
        (["profile=true"], ["bucket_cap_mb=1"], "selects none"),  # no cell is profiled
        (["world_size=two"], [], "world_size takes int, and 'two' is not one"),
        (["batch_size=8.5"], [], "batch_size takes int"),
        (["profile=2"], [], "profile takes bool"),
        (["steps=true"], [], "steps takes int"),
        (["bucket_cap_mb=1e-300"], [], "must be between 1 byte"),
        (["colour=red"], [], "no cell key 'colour'"),
        (["srn-100k"], [], "neither key=value nor a cell-id prefix"),
        (["regime=tpu"], [], "regime is one of cpu-gloo"),
    ],
)
def test_bad_terms_and_empty_selections_are_errors(
    cells: tuple[matrix.Cell, ...], only: list[str], exclude: list[str], said: str
) -> None:
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        select(cells, tuple(only), tuple(exclude))


@pytest.mark.parametrize("flags", [["--only", "bucket_cap_mb=7"], ["--exclude", ""]])
def test_the_driver_says_it_before_ray_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
) -> None:
    connects: list[object] = []  # the driver reaches Ray only through connect()
    monkeypatch.setattr(run_matrix, "connect", lambda *a, **k: connects.append(a))
    path = tmp_path / "sel.yaml"
    path.write_text(MATRIX)
    status = run_matrix.main(["--matrix", str(path), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: --") and err.count("\n") == 1, err
    assert not connects and not (tmp_path / "o").exists()
