"""The step-model benchmark's split, read from ``step_model_split.yaml`` (committed before a run).

Both ``bench_step_model.py`` (which cells to collect) and ``step_model_analysis.py`` (which cells
calibrate and which are scored) read it through :func:`load_split`, so the split is declared in
one place and cannot drift between the collection and the analysis. Every key is checked and an
error names the file, the key and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commprof.caps import check_cap_mb
from commprof.catalog import parameter_sizes
from commprof.yamlio import load_yaml, read_text, short

SPLIT_FILE = Path(__file__).resolve().parent / "step_model_split.yaml"
"""The committed split."""
MAX_SPLIT_BYTES = 64 * 1024
"""Largest split file read."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorldCell:
    """A held-out cell at another world size, predicted from the model's calibration."""

    world_size: int
    """Ranks (all on this host, sharing its cores)."""
    bucket_cap_mb: float
    """The cap (MiB)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSplit:
    """One model's cells: its calibration cap and what is held out."""

    name: str
    """A ``commprof.catalog`` model."""
    batch_size: int
    """Per-rank batch size."""
    pair_steps: int
    """Cycles of the round's step-interleaved pairs (``bench_step_model._pairs_gang``)."""
    calibration_cap_mb: float
    """The cap calibrated on (MiB), at the split's world size."""
    held_out_caps_mb: tuple[float, ...]
    """Caps predicted at the split's world size (MiB)."""
    held_out_worlds: tuple[WorldCell, ...]
    """Other world sizes predicted."""

    @property
    def caps_mb(self) -> tuple[float, ...]:
        """Every cap at the split's world size, ascending (the advice chooses among them)."""
        return tuple(sorted((*self.held_out_caps_mb, self.calibration_cap_mb)))


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """The whole split."""

    world_size: int
    """World size of every calibration and held-out cap."""
    models: tuple[ModelSplit, ...]
    """In the file's order."""

    def model(self, name: str) -> ModelSplit:
        """The split of ``name``.

        Raises:
            ValueError: ``name`` is not in the split.
        """
        for m in self.models:
            if m.name == name:
                return m
        raise ValueError(f"model {name!r} is not in the split; it has {self.names}")

    @property
    def names(self) -> tuple[str, ...]:
        """The models, in the file's order."""
        return tuple(m.name for m in self.models)


def _where(path: Path, key: str) -> str:
    return f"{path}: {key}"


def _int(path: Path, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{_where(path, key)} must be an integer >= {minimum}, got {short(value)}")
    return value


def _cap(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{_where(path, key)} must be a number of MiB, got {short(value)}")
    cap = check_cap_mb(float(value), key=_where(path, key))
    assert cap is not None and math.isfinite(cap)  # a number in range, never DDP's default
    return cap


def _mapping(path: Path, key: str, value: Any, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{_where(path, key)} must be a mapping, got {short(value)}")
    missing, extra = keys - set(value), set(value) - keys
    if missing or extra:
        raise ValueError(
            f"{_where(path, key)} must have exactly the keys {sorted(keys)}; "
            f"missing {sorted(missing)}, unknown {sorted(map(str, extra))}"
        )
    return value


def _list(path: Path, key: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{_where(path, key)} must be a list, got {short(value)}")
    return value


MODEL_KEYS = {
    "batch_size", "pair_steps", "calibration_cap_mb", "held_out_caps_mb", "held_out_world_sizes",
}  # fmt: skip
WORLD_KEYS = {"world_size", "bucket_cap_mb"}


def _model(path: Path, name: Any, value: Any, world_size: int) -> ModelSplit:
    key = f"models.{name}"
    if not isinstance(name, str):
        raise ValueError(f"{_where(path, 'models')}: a model name must be a string, got {name!r}")
    try:
        parameter_sizes(name)
    except ValueError as err:
        raise ValueError(f"{_where(path, key)}: {err}") from err
    spec = _mapping(path, key, value, MODEL_KEYS)
    calibration = _cap(path, f"{key}.calibration_cap_mb", spec["calibration_cap_mb"])
    caps = tuple(
        _cap(path, f"{key}.held_out_caps_mb[{i}]", c)
        for i, c in enumerate(_list(path, f"{key}.held_out_caps_mb", spec["held_out_caps_mb"]))
    )
    if not caps:
        raise ValueError(f"{_where(path, key)}.held_out_caps_mb must name at least one cap")
    if len(set(caps)) != len(caps) or calibration in caps:
        raise ValueError(
            f"{_where(path, key)}.held_out_caps_mb {list(caps)} must be distinct and leave out "
            f"the calibration cap {calibration:g}"
        )
    worlds = []
    entries = _list(path, f"{key}.held_out_world_sizes", spec["held_out_world_sizes"])
    for i, entry in enumerate(entries):
        where = f"{key}.held_out_world_sizes[{i}]"
        cell = _mapping(path, where, entry, WORLD_KEYS)
        ws = _int(path, f"{where}.world_size", cell["world_size"], 2)
        if ws == world_size:
            raise ValueError(
                f"{_where(path, where)}.world_size {ws} is the calibration world size; name "
                "another (the caps at this one are held_out_caps_mb)"
            )
        worlds.append(
            WorldCell(
                world_size=ws,
                bucket_cap_mb=_cap(path, f"{where}.bucket_cap_mb", cell["bucket_cap_mb"]),
            )
        )
    if len(set(worlds)) != len(worlds):
        raise ValueError(f"{_where(path, key)}.held_out_world_sizes names a cell twice")
    return ModelSplit(
        name=name,
        batch_size=_int(path, f"{key}.batch_size", spec["batch_size"], 1),
        pair_steps=_int(path, f"{key}.pair_steps", spec["pair_steps"], 1),
        calibration_cap_mb=calibration,
        held_out_caps_mb=caps,
        held_out_worlds=tuple(worlds),
    )


def load_split(path: Path = SPLIT_FILE) -> Split:
    """The split in ``path`` (YAML, read with the project's strict safe loader).

    Raises:
        ValueError: naming the file, the key and the value that is wrong.
    """
    doc = load_yaml(read_text(path, "the step-model split", max_bytes=MAX_SPLIT_BYTES), str(path))
    top = _mapping(path, "(top level)", doc, {"world_size", "models"})
    world_size = _int(path, "world_size", top["world_size"], 2)
    models = top["models"]
    if not isinstance(models, dict) or not models:
        raise ValueError(f"{_where(path, 'models')} must map model names to their cells")
    return Split(
        world_size=world_size,
        models=tuple(_model(path, n, v, world_size) for n, v in models.items()),
    )
