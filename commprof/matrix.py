"""Matrix YAML -> validated, expanded cells with stable ids.

A matrix file names axes (each a list of values); the cells are their Cartesian product, times
``repeats``. Every key is checked before anything runs: an unknown key, a wrong type or an
impossible value raises :class:`MatrixError` naming the file, the key and what is allowed.

Example::

    name: smoke
    axes:
      model: [srn-100k, srn-1m]
      world_size: [2]
      bucket_cap_mb: [1, 25, null]  # null: DDP's default cap
    defaults:
      steps: 6
    run:
      max_attempts: 2

This module imports no torch and no ray (docs/design.md, "Layers").
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commprof.caps import check_cap_mb
from commprof.catalog import model_spec
from commprof.yamlio import SHORT_CHARS, load_yaml, read_text, short

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")
PLACEMENTS = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
HOOKS = ("allreduce", "fp16")
REGIMES = {
    "cpu-gloo": ("gloo", "cpu"),
    "cuda-nccl": ("nccl", "cuda"),
    "cuda-gloo": ("gloo", "cuda"),
}
"""The regimes by name, each with its (backend, device): how a trace's events are classified
(one rule table each), and a matrix axis that sets backend and device together (docs/design.md,
Regimes). The one definition; :func:`regime_of` names the regime of a backend and device."""


def regime_of(backend: str, device: str) -> str:
    """The regime of a backend and a device (``cuda:1`` is ``cuda``), e.g. ``cuda-gloo``."""
    return f"{'cuda' if str(device).startswith('cuda') else 'cpu'}-{backend}"


OPTIMIZERS = ("sgd", "adam")


RUN_SWEEP = "run"
"""The sweep name of the cells ``commprof run`` writes (a report tells them from a Ray sweep's by
it); no matrix may take it."""


class MatrixError(ValueError):
    """A matrix file or value the user must change; the message names file and key."""


_NOT_LATER = object()


@dataclass(frozen=True, kw_only=True, slots=True)
class FieldSpec:
    """The one declaration of a cell field; everything else that lists the fields derives from it.

    Derived: the identity fields of the cell id (:func:`config_hash`), the keys a matrix file
    accepts in ``axes`` and ``defaults`` with their YAML types, the configuration columns of the
    ``cells`` table (``commprof.results.SCHEMAS``), and the flags of ``commprof run``
    (:func:`cell_flags`).
    """

    help: str
    """What the field means, for docstrings, ``--help`` and error messages."""
    unit: str = ""
    """Unit of a number (``MiB``, ``bytes``); empty for counts and names."""
    identity: bool = True
    """Enters the cell id: two cells equal in every identity field are one measurement."""
    axis: bool = False
    """May be an axis of a matrix file (else only a ``defaults`` key)."""
    setting: bool = True
    """May be set in a matrix file at all (``microbench_sizes_bytes`` has its own section)."""
    column: str | None = None
    """Arrow type of its column in the ``cells`` table (a ``pyarrow`` factory name); None keeps
    it in ``config_json`` only."""
    flag: bool = False
    """A flag of ``commprof run``."""
    choices: tuple[str, ...] = ()
    """The allowed values of a name, checked when a cell is made."""
    since: Any = _NOT_LATER
    """For an identity field added after datasets existed: the value every earlier cell had.
    :func:`config_hash` leaves the field out at that value, so earlier cells keep their ids."""
    role: str = "measurement"
    """What the field is to a configuration (:data:`ROLES`): ``workload`` (what trains and
    communicates: two cells equal in every workload field are one configuration, whose repeats
    the step model pools), ``instrument`` (what the measurement adds to the workload: the
    profiler), ``measurement`` (how long and how it is measured) or ``index`` (``repeat``)."""
    link: bool = False
    """Cells equal in every link field share one link: their microbenchmarks and interference
    arms measure the same backend, device and world size (:data:`LINK_FIELDS`)."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role {self.role!r} is not one of {ROLES}")


ROLES = ("workload", "instrument", "measurement", "index")
"""The roles a cell field plays (:attr:`FieldSpec.role`)."""


def _spec(default: Any = dataclasses.MISSING, **spec: Any) -> Any:
    return field(default=default, metadata={"spec": FieldSpec(**spec)})


_INT_LIMITS = {"int32": 2**31 - 1, "int64": 2**63 - 1}
"""Largest magnitude of an integer field, by its ``cells`` column type (int32 where it has none)."""
MAX_TIMEOUT_S = 7 * 86_400.0
"""Longest timeout a matrix or flag may set (a week): past it, a typo, not a plan."""
MAX_ATTEMPTS = 100
"""Most attempts ``run.max_attempts`` may allow a cell."""
MAX_MATRIX_BYTES = 1 << 20
"""Largest matrix file (1 MiB): a matrix names axes and their values, tens of lines."""
MAX_CELLS = 10_000
"""Most cells a matrix may expand to (axes' product times ``repeats``): past it, a typo, or a
sweep of days to split into several matrices."""
MAX_REPEATS = 1_000
"""Most ``repeats`` of a matrix."""
MAX_NAME_CHARS = 100
"""Longest matrix ``name`` (it names the results folder)."""
MAX_MICROBENCH_SIZES = 32
"""Most microbenchmark sizes of a matrix (the guard bounds a rank's microbenchmark rows by
``commprof.modeling.memory.MICROBENCH_ROWS_BOUND``, the model's bucket sizes included)."""
MAX_MICROBENCH_BYTES = 1 << 40
"""Largest microbenchmark size (1 TiB); the memory guard costs each cell's buffers too."""
MIN_MICROBENCH_SIZES = 3
"""Fewest distinct microbenchmark sizes a matrix may name: the ring fit of ``commprof report``
and ``estimate --fit`` needs 3 points (``commprof.modeling.collective.ring_fit.MIN_POINTS``)."""
MAX_ENV_CHARS = 4096
"""Longest value of a matrix's ``env`` section."""

_YAML_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "float | None": (int, float, type(None)),
}
"""The YAML value types of a field, by its annotation (YAML has no float-only integers)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    """One configuration to measure: a point of the matrix."""

    model: str = _spec(
        help="model name: one of commprof.catalog.MODEL_NAMES, or srn-<N>k / srn-<N>m for a "
        "residual MLP of about N thousand or million parameters",
        axis=True,
        column="string",
        flag=True,
        role="workload",
    )
    world_size: int = _spec(
        help="number of ranks (processes) in the process group",
        axis=True,
        column="int32",
        flag=True,
        role="workload",
        link=True,
    )
    bucket_cap_mb: float | None = _spec(
        help="DDP bucket_cap_mb, as DDP reads it; unset (null in a matrix, 'default' on the "
        "command line) is DDP's default: 25 MiB with a first bucket of 1 MiB",
        unit="MiB",
        axis=True,
        column="float64",
        flag=True,
        role="workload",
    )
    backend: str = _spec(
        "gloo",
        help="torch.distributed backend",
        axis=True,
        column="string",
        flag=True,
        choices=BACKENDS,
        role="workload",
        link=True,
    )
    device: str = _spec(
        "cpu",
        help="where tensors live (gloo over cuda tensors is the cuda-gloo regime)",
        axis=True,
        column="string",
        flag=True,
        choices=DEVICES,
        role="workload",
        link=True,
    )
    placement: str = _spec(
        "PACK",
        help="Ray placement-group strategy of the gang of ranks",
        axis=True,
        column="string",
        choices=PLACEMENTS,
        role="workload",
    )
    hook: str = _spec(
        "allreduce",
        help="inner communication hook the timing wrapper composes with",
        axis=True,
        column="string",
        flag=True,
        choices=HOOKS,
        role="workload",
    )
    optimizer: str = _spec(
        "sgd",
        help="optimizer: sgd (with momentum) or adam",
        axis=True,
        column="string",
        choices=OPTIMIZERS,
        role="workload",
    )
    steps: int = _spec(
        6, help="training steps in total, warm-up included", axis=True, column="int32", flag=True
    )
    warmup_steps: int = _spec(
        1,
        help="steps not measured at the start (step 0 never is)",
        column="int32",
        flag=True,
    )
    batch_size: int = _spec(
        8, help="per-rank batch size", axis=True, column="int32", flag=True, role="workload"
    )
    seed: int = _spec(
        0, help="seed of the synthetic data and the model initialisation", column="int64", flag=True
    )
    repeat: int = _spec(
        0,
        help="repetition index of an otherwise identical configuration (a new cell id)",
        setting=False,
        column="int32",
        flag=True,
        role="index",
    )
    microbench_sizes_bytes: tuple[int, ...] = _spec(
        (),
        help="all-reduce microbenchmark message sizes; the model's bucket sizes are added",
        unit="bytes",
        setting=False,
    )
    microbench_iters: int = _spec(5, help="timed microbenchmark iterations per size and pass")
    microbench_passes: int = _spec(
        1, help="rounds over the microbenchmark sizes, each in a shuffled order", since=1
    )
    interference_iters: int = _spec(
        5,
        help="timed iterations per size of the microbenchmark's interference arms (0: none)",
        since=0,
    )
    hook_cost_pairs: int = _spec(
        0,
        help="pairs of steps run after the measured ones to measure the timing hook's cost: in "
        "each pair one step of the hooked model and one of a plain DDP replica without the "
        "hook, in a seeded random order (0: none; commprof.training.hook_cost)",
        flag=True,
        since=0,
    )
    profile: bool = _spec(
        False,
        help="also record a torch.profiler trace per rank and derive trace metrics from it",
        axis=True,
        column="bool_",
        flag=True,
        role="instrument",
    )

    def __post_init__(self) -> None:
        # 25 and 25.0 MiB are one configuration: one id (frozen, so set through object).
        try:  # the one rule for caps (commprof.caps): within what DDP takes
            object.__setattr__(self, "bucket_cap_mb", check_cap_mb(self.bucket_cap_mb))
        except (TypeError, ValueError) as err:
            raise MatrixError(str(err)) from None
        try:  # the one rule for model names (commprof.catalog.model_spec)
            model_spec(self.model)
        except (TypeError, ValueError) as err:
            raise MatrixError(f"model: {err}") from None
        for name, spec in CELL_FIELDS.items():
            value = getattr(self, name)
            if spec.choices and value not in spec.choices:
                raise MatrixError(f"{name} {short(value)} is not one of: {', '.join(spec.choices)}")
            limit = _INT_LIMITS.get(spec.column or "int32", _INT_LIMITS["int32"])
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
                raise MatrixError(f"{name}={value} is out of range: at most {limit:,}")
        if self.backend == "nccl" and self.device != "cuda":
            raise MatrixError("backend 'nccl' needs device 'cuda'; use backend 'gloo' on cpu")
        for name in ("world_size", "steps", "batch_size", "microbench_iters", "microbench_passes"):
            if getattr(self, name) < 1:
                raise MatrixError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        # Step 0 is never measured (one bucket, before DDP's rebuild): at least one step after
        # max(1, warmup_steps) must remain.
        if self.warmup_steps < 0 or max(1, self.warmup_steps) > self.steps - 1:
            raise MatrixError(
                f"steps={self.steps} with warmup_steps={self.warmup_steps} leaves no measured "
                "step (step 0 and the warm-up steps are not measured); raise steps "
                "(--steps) or lower warmup_steps (--warmup-steps)"
            )
        for name in ("interference_iters", "hook_cost_pairs", "repeat"):
            if getattr(self, name) < 0:
                raise MatrixError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        bad = [n for n in self.microbench_sizes_bytes if not 0 < n <= MAX_MICROBENCH_BYTES]
        if bad:
            raise MatrixError(
                f"microbench sizes must be > 0 bytes and at most {MAX_MICROBENCH_BYTES:,} (1 TiB), "
                f"got {short(bad)}"
            )

    @property
    def cell_id(self) -> str:
        """Short hash of the canonical configuration: equal configs, equal ids."""
        return config_hash(self.config())

    @property
    def gang_shape(self) -> tuple[int, str, str]:
        """What a gang of rank actors must match to be reused: (world size, device, placement)."""
        return (self.world_size, self.device, self.placement)

    @property
    def regime(self) -> str:
        """The cell's regime (:data:`REGIMES`)."""
        return regime_of(self.backend, self.device)

    def config(self) -> dict[str, Any]:
        """The identity fields as plain JSON-able values."""
        return {name: _plain(getattr(self, name)) for name in ID_FIELDS}


CELL_FIELDS: dict[str, FieldSpec] = {f.name: f.metadata["spec"] for f in dataclasses.fields(Cell)}
"""Every field of :class:`Cell` with its declaration, in field order."""
ID_FIELDS = tuple(name for name, spec in CELL_FIELDS.items() if spec.identity)
"""Fields that enter the cell id."""
_LATER_ID_DEFAULTS = {
    name: spec.since for name, spec in CELL_FIELDS.items() if spec.since is not _NOT_LATER
}
WORKLOAD_FIELDS = tuple(name for name, spec in CELL_FIELDS.items() if spec.role == "workload")
"""Fields that make a configuration: cells equal in all of them are repeats of one, whatever
their seeds, step counts or measurement settings (the step model pools such repeats)."""
INSTRUMENT_FIELDS = tuple(name for name, spec in CELL_FIELDS.items() if spec.role == "instrument")
"""Fields of what the measurement adds to the workload (the profiler)."""
LINK_FIELDS = tuple(name for name, spec in CELL_FIELDS.items() if spec.link)
"""Fields of the link a cell measures (backend, device, world size): cells equal in these share
their microbenchmarks' link fit and interference factors."""
CONFIG_KEY_FIELDS = tuple(n for n in ID_FIELDS if CELL_FIELDS[n].role != "index")
"""Identity fields but the repeat index: equal in all of them, two cells are repeats of one
measurement (:func:`config_key`; the processed tables merge them)."""
CELL_COLUMNS = tuple((name, spec.column) for name, spec in CELL_FIELDS.items() if spec.column)
"""(name, Arrow type name) of the configuration columns of the ``cells`` table."""


def field_types(name: str) -> tuple[type, ...]:
    """The YAML (and command-line) value types a cell field accepts."""
    annotation = str(next(f.type for f in dataclasses.fields(Cell) if f.name == name))
    return _YAML_TYPES[annotation]


def config_hash(config: Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the canonical JSON of ``config``.

    Identity fields added after datasets existed are left out where they hold the value every
    earlier cell had (``_LATER_ID_DEFAULTS``), so a stored config hashes the same with or
    without them.
    """
    hashed = {
        key: value
        for key, value in config.items()
        if key not in _LATER_ID_DEFAULTS or value != _LATER_ID_DEFAULTS[key]
    }
    canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def config_key(config: Mapping[str, Any]) -> str:
    """Id of a configuration without its repeat index: equal for the repeats of one cell.

    Args:
        config: a cell's identity fields (``Cell.config()``, or its stored ``config_json``).

    Returns:
        12 hex digits: :func:`config_hash` of ``config`` without the index fields
        (:data:`CONFIG_KEY_FIELDS` are the rest).
    """
    return config_hash({k: v for k, v in config.items() if k in CONFIG_KEY_FIELDS})


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPolicy:
    """How the driver runs the cells of a matrix."""

    max_attempts: int = 2
    """Attempts per cell before it stays failed (errors that would repeat stop earlier)."""
    cell_timeout_s: float = 600.0
    """Wall-clock limit of one cell attempt; the whole gang is stopped past it."""
    pg_timeout_s: float = 60.0
    """torch.distributed process-group timeout: short, so a lost peer fails fast."""
    exclusive: bool = False
    """Run one cell at a time (a link being measured must not be shared)."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise MatrixError(f"run.max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_attempts > MAX_ATTEMPTS:
            raise MatrixError(
                f"run.max_attempts must be <= {MAX_ATTEMPTS}, got {self.max_attempts}"
            )
        for name in ("cell_timeout_s", "pg_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
                raise MatrixError(
                    f"run.{name} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {value}"
                )


@dataclass(frozen=True, kw_only=True, slots=True)
class Matrix:
    """A validated matrix file: its name, expanded cells, run policy and memory budgets."""

    name: str
    """Name of the sweep; the default dataset folder is ``results/<name>/``."""
    source: str
    """File the matrix was read from (for messages)."""
    cells: tuple[Cell, ...]
    """Expanded cells, in file order (axes varying last-fastest)."""
    run: RunPolicy = field(default_factory=RunPolicy)
    """Driver policy."""
    budget_bytes: dict[str, int] = field(default_factory=dict)
    """Memory budgets by pool name, overriding detected ones."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of every rank process (``NCCL_*``, ``GLOO_*``, ``TORCH_*``), set
    through Ray's ``runtime_env`` where the ranks start, not in the driver. Not part of a cell's
    id: the ranks record the variables they saw in ``env_json``."""


# Allowed keys per section, with the type each value must have.
_AXES: dict[str, tuple[type, ...]] = {
    "regime": (str,),  # not a field: it sets backend and device together
    **{name: field_types(name) for name, spec in CELL_FIELDS.items() if spec.axis},
}
_DEFAULTS: dict[str, tuple[type, ...]] = {
    **_AXES,
    **{name: field_types(name) for name, spec in CELL_FIELDS.items() if spec.setting},
}
_RUN: dict[str, tuple[type, ...]] = {
    "max_attempts": (int,),
    "cell_timeout_s": (int, float),
    "pg_timeout_s": (int, float),
    "exclusive": (bool,),
}
_BUDGET_POOLS = (
    "device_bytes",
    "host_ram_bytes",
    "pinned_bytes",
    "shm_bytes",
    "object_store_bytes",
)
_TOP = (
    "name",
    "description",
    "axes",
    "defaults",
    "repeats",
    "run",
    "budget",
    "microbench",
    "env",
)
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A matrix name: a folder name on every filesystem (matched whole: no trailing newline)."""
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
"""Variables a matrix's ``env`` section may set in the ranks: the collective libraries' and
PyTorch's own (``TORCH_NCCL_*``, ``TORCH_DISTRIBUTED_DEBUG``); nothing that moves devices or Ray."""
_ENV_NAME_RE = re.compile(r"^(NCCL|GLOO|TORCH)_[A-Z0-9_]+$")


def load(path: str | Path) -> Matrix:
    """Read, validate and expand a matrix YAML file.

    Args:
        path: the matrix file.

    Returns:
        The validated matrix.

    Raises:
        MatrixError: naming the file and key to change.
    """
    try:
        raw = load_yaml(read_text(path, "the matrix file", max_bytes=MAX_MATRIX_BYTES), str(path))
    except ValueError as err:
        raise MatrixError(str(err)) from None
    return parse(raw, source=str(path))


def parse(raw: Any, *, source: str = "<matrix>") -> Matrix:
    """Validate and expand an already-parsed matrix document.

    Args:
        raw: the document (a mapping) as :func:`commprof.yamlio.load_yaml` returns it.
        source: a name for messages, usually the file path.

    Returns:
        The validated matrix.
    """
    if not isinstance(raw, dict):
        raise MatrixError(f"{source}: the matrix must be a mapping with keys {', '.join(_TOP)}")
    _check_keys(raw, _TOP, source, "")
    name = raw.get("name", Path(source).stem)
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not _NAME_RE.fullmatch(name):
        raise MatrixError(
            f"{source}: key 'name': {short(name)} must be up to {MAX_NAME_CHARS} letters, digits, "
            "'.', '_' or '-', starting with a letter or digit (it names the results folder; a "
            "file without 'name' takes its file name)"
        )
    if name == RUN_SWEEP:
        raise MatrixError(
            f"{source}: key 'name': {name!r} is the name `commprof run` gives its cells; name the "
            "matrix otherwise (a file without 'name' takes its file name)"
        )
    axes = _section(raw, "axes", source)
    _check_keys(axes, tuple(_AXES), source, "axes.")
    for key in ("model", "world_size", "bucket_cap_mb"):
        if key not in axes:
            raise MatrixError(f"{source}: key 'axes.{key}' is required")
    axis_values = {k: _axis_list(v, k, source) for k, v in axes.items()}
    defaults = _section(raw, "defaults", source)
    _check_keys(defaults, tuple(_DEFAULTS), source, "defaults.")
    for key, value in defaults.items():
        _check_type(value, _DEFAULTS[key], f"defaults.{key}", source)
    repeats = raw.get("repeats", 1)
    _check_type(repeats, (int,), "repeats", source)
    if not 1 <= repeats <= MAX_REPEATS:
        raise MatrixError(f"{source}: key 'repeats' must be in [1, {MAX_REPEATS:,}], got {repeats}")
    num_cells = math.prod(len(v) for v in axis_values.values()) * repeats
    if num_cells > MAX_CELLS:
        counts = " x ".join(f"{k} {len(v)}" for k, v in axis_values.items())
        raise MatrixError(
            f"{source}: the matrix expands to {num_cells:,} cells ({counts}, repeats {repeats}); "
            f"at most {MAX_CELLS:,}: fewer values in 'axes' or fewer 'repeats', or split it into "
            "several matrices"
        )
    microbench = _microbench_sizes(raw.get("microbench"), source)

    run_raw = _section(raw, "run", source)
    _check_keys(run_raw, tuple(_RUN), source, "run.")
    for key, value in run_raw.items():
        _check_type(value, _RUN[key], f"run.{key}", source)
    budget_raw = _section(raw, "budget", source)
    _check_keys(budget_raw, _BUDGET_POOLS, source, "budget.")
    for key, value in budget_raw.items():
        _check_type(value, (int,), f"budget.{key}", source)
        if value <= 0:
            raise MatrixError(f"{source}: key 'budget.{key}' must be > 0 bytes, got {value}")

    if "regime" in axis_values or "regime" in defaults:
        clash = [k for k in ("backend", "device") if k in axis_values or k in defaults]
        if clash:
            raise MatrixError(
                f"{source}: key 'regime' sets backend and device; remove {', '.join(clash)}"
            )
    keys = list(axis_values)
    cells = []
    for combo in itertools.product(*(axis_values[k] for k in keys)):
        values = {**defaults, **dict(zip(keys, combo, strict=True))}
        if "regime" in values:
            regime = values.pop("regime")
            if regime not in REGIMES:
                raise MatrixError(
                    f"{source}: key 'axes.regime': {short(regime)} is not one of: "
                    f"{', '.join(REGIMES)}"
                )
            values["backend"], values["device"] = REGIMES[regime]
        for repeat in range(repeats):
            try:
                cells.append(Cell(**values, repeat=repeat, microbench_sizes_bytes=microbench))
            except MatrixError as err:
                where = ", ".join(f"{k}={short(v)}" for k, v in zip(keys, combo, strict=True))
                raise MatrixError(f"{source}: cell ({where}): {err}") from None
    try:
        run = RunPolicy(**run_raw)
    except MatrixError as err:
        raise MatrixError(f"{source}: {err}") from None
    env = _env_section(raw.get("env"), source)
    return Matrix(
        name=name, source=source, cells=tuple(cells), run=run, budget_bytes=budget_raw, env=env
    )


def _env_section(value: Any, source: str) -> dict[str, str]:
    """The ``env`` section: variable names with one of ``ENV_PREFIXES``, string values."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MatrixError(
            f"{source}: key 'env' must be a mapping of variable names to strings, got "
            f"{type(value).__name__}"
        )
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.fullmatch(key):
            name = key if isinstance(key, str) and len(key) < SHORT_CHARS else short(key)
            raise MatrixError(
                f"{source}: key 'env.{name}': only variables named {', '.join(ENV_PREFIXES)}... "
                "(upper case, digits, '_') reach the ranks"
            )
        if not isinstance(item, str):
            raise MatrixError(
                f"{source}: key 'env.{key}': {short(item)} is a {type(item).__name__}; quote it "
                f'(env.{key}: "{short(item)}"): environment values are strings'
            )
        # control characters, line and paragraph separators, zero-width and format characters
        # (U+200B, U+FEFF), lone surrogates (no UTF-8 for them: the ranks would never start)
        bad = next((i for i, c in enumerate(item) if not c.isprintable()), None)
        if bad is not None:
            raise MatrixError(
                f"{source}: key 'env.{key}': the value holds a control or invisible character "
                f"(U+{ord(item[bad]):04X} at position {bad}); an environment value is one line of "
                "printable text"
            )
        if len(item) > MAX_ENV_CHARS:
            raise MatrixError(
                f"{source}: key 'env.{key}': the value is {len(item):,} characters long; at most "
                f"{MAX_ENV_CHARS:,}"
            )
    return dict(value)


def _section(raw: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise MatrixError(f"{source}: key '{key}' must be a mapping, got {type(value).__name__}")
    return value


def _check_keys(section: dict[str, Any], allowed: tuple[str, ...], source: str, prefix: str):
    for key in section:
        if key not in allowed:
            raise MatrixError(
                f"{source}: unknown key '{prefix}{key}'; allowed here: {', '.join(allowed)}"
            )


def _check_type(value: Any, types: tuple[type, ...], key: str, source: str) -> None:
    # bool is an int in Python; a YAML `true` is never a valid count or size.
    is_bool = isinstance(value, bool) and bool not in types
    if is_bool or not isinstance(value, types):
        wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise MatrixError(
            f"{source}: key '{key}': {short(value)} is a {type(value).__name__}, expected {wanted}"
        )


def _axis_list(value: Any, key: str, source: str) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise MatrixError(f"{source}: key 'axes.{key}' is an empty list; give at least one value")
    for item in values:
        _check_type(item, _AXES[key], f"axes.{key}", source)
    if len(set(values)) != len(values):
        raise MatrixError(f"{source}: key 'axes.{key}' repeats a value: {short(values)}")
    return values


def _microbench_sizes(value: Any, source: str) -> tuple[int, ...]:
    """Sizes from ``microbench: {sizes_bytes: [...]}`` or ``{min_bytes, max_bytes, factor}``."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise MatrixError(f"{source}: key 'microbench' must be a mapping")
    _check_keys(value, ("sizes_bytes", "min_bytes", "max_bytes", "factor"), source, "microbench.")
    if "sizes_bytes" in value:
        key = "microbench.sizes_bytes"
        sizes = value["sizes_bytes"]
        if not isinstance(sizes, list):
            raise MatrixError(f"{source}: key '{key}' must be a list of ints")
        if len(sizes) > MAX_MICROBENCH_SIZES:
            raise MatrixError(
                f"{source}: key '{key}' lists {len(sizes):,} sizes; at most {MAX_MICROBENCH_SIZES}"
            )
        for size in sizes:
            _check_type(size, (int,), key, source)
        found = tuple(sizes)
    else:
        key = "microbench"
        lo, hi, factor = value.get("min_bytes"), value.get("max_bytes"), value.get("factor", 2)
        for name, item in (("min_bytes", lo), ("max_bytes", hi), ("factor", factor)):
            _check_type(item, (int,), f"microbench.{name}", source)
        assert isinstance(lo, int) and isinstance(hi, int) and isinstance(factor, int)
        if hi > MAX_MICROBENCH_BYTES:
            raise MatrixError(
                f"{source}: key 'microbench.max_bytes' is {hi:,}; at most {MAX_MICROBENCH_BYTES:,}"
                " (1 TiB)"
            )
        try:
            found = geometric_sizes(lo, hi, factor)
        except ValueError as err:
            raise MatrixError(f"{source}: key 'microbench': {err}") from None
        if len(found) > MAX_MICROBENCH_SIZES:
            raise MatrixError(
                f"{source}: key 'microbench' makes {len(found)} sizes from {lo:,} to {hi:,} by "
                f"{factor}; at most {MAX_MICROBENCH_SIZES}: a larger factor or a narrower range"
            )
    bad = [n for n in found if not 0 < n <= MAX_MICROBENCH_BYTES]
    if bad:
        raise MatrixError(
            f"{source}: key '{key}': sizes must be > 0 bytes and at most "
            f"{MAX_MICROBENCH_BYTES:,} (1 TiB), got {short(bad)}"
        )
    if len(set(found)) < MIN_MICROBENCH_SIZES:
        raise MatrixError(
            f"{source}: key '{key}' gives {len(set(found))} distinct size(s); the link fit of "
            f"commprof report and estimate --fit needs at least {MIN_MICROBENCH_SIZES}: give more, "
            "or leave out 'microbench' (16 KiB to 16 MiB by factor 4)"
        )
    return found


def geometric_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> tuple[int, ...]:
    """Sizes min, min*factor, ... up to max inclusive (nccl-tests ``-b -e -f``).

    Args:
        min_bytes: Smallest size (> 0).
        max_bytes: Largest size (>= min_bytes).
        factor: Multiplication factor (>= 2).

    Returns:
        The sizes in increasing order.
    """
    if min_bytes <= 0 or max_bytes < min_bytes or factor < 2:
        raise ValueError(
            f"need 0 < min_bytes <= max_bytes and factor >= 2, got {min_bytes}, "
            f"{max_bytes}, {factor}"
        )
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def cell_from_config(config: Mapping[str, Any]) -> Cell:
    """Rebuild a cell from its ``config()`` (as stored in the dataset)."""
    names = {f.name for f in dataclasses.fields(Cell)}
    values = {k: v for k, v in config.items() if k in names}
    # A config stored before a later identity field existed had that field's earlier value.
    values = {**{k: v for k, v in _LATER_ID_DEFAULTS.items() if k not in values}, **values}
    if "microbench_sizes_bytes" in values:
        values["microbench_sizes_bytes"] = tuple(values["microbench_sizes_bytes"])
    return Cell(**values)
