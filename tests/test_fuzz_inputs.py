"""Property-based fuzz of every input validator (issue #44): a matrix, a cluster file, a
parameter file, an interconnect file, a lock file, YAML text, and ``analyze`` on mutated real
traces (tests/data/golden_gloo2). Each input is either accepted or refused with a ValueError
(the commands print it as one line and exit 2); no other exception, ever.

Each test prints ``fuzz <what>: N tried, A accepted, R refused`` (``pytest -s`` shows it).
Bounded by example counts (``max_examples``), not by time, so it holds on a busy machine; the
whole file runs in well under a minute.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import warnings
from collections import Counter
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commprof import matrix
from commprof.commands.estimate import load_param_sizes_file
from commprof.lock import parse_record
from commprof.modeling.collective import clusters, interconnects
from commprof.yamlio import load_yaml

GOLDEN = Path(__file__).parent / "data" / "golden_gloo2"
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.integers(min_value=-3, max_value=70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["srn-100k", "gloo", "cpu", "nccl", "1e400", "-5", "\u2028", "\ud800", ""])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _tally(what: str, check: Callable[..., None], tally: Counter[str]) -> None:
    """Run the hypothesis test ``check`` and print its outcome counts."""
    check()
    tried = sum(tally.values())
    print(f"fuzz {what}: {tried} tried, {tally['accepted']} accepted, {tally['refused']} refused")
    assert tried > 0 and set(tally) <= {"accepted", "refused"}


def _judge(tally: Counter[str], run: Callable[[], Any]) -> None:
    """Run one validator: accepted, or refused with a ValueError in one line. Anything else
    propagates and fails the test (hypothesis shrinks it to the smallest input)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run()
    except ValueError as err:
        assert str(err).strip(), "an empty refusal names nothing"
        tally["refused"] += 1
        return
    tally["accepted"] += 1


def _mutate(doc: Any, path: list[int], value: Any, add: bool) -> Any:
    """``doc`` with the node chosen by ``path`` (indices into its keys or items, each taken
    modulo their number) replaced by ``value``, or given ``value`` as a new key (``add``)."""
    doc = copy.deepcopy(doc)
    node, parent, key = doc, None, None
    for step in path:
        if isinstance(node, dict) and node:
            parent, key = node, sorted(node, key=str)[step % len(node)]
        elif isinstance(node, list) and node:
            parent, key = node, step % len(node)
        else:
            break
        node = parent[key]
    if parent is None:
        return value
    if add and isinstance(node, dict):
        node[f"k{len(node)}"] = value
    else:
        parent[key] = value
    return doc


MUTATIONS = st.none() | st.tuples(st.lists(st.integers(0, 50), max_size=5), VALUES, st.booleans())
"""A change to a document (None: none, so the valid base is tried too)."""


def _apply(doc: Any, mutation: tuple[list[int], Any, bool] | None) -> Any:
    return copy.deepcopy(doc) if mutation is None else _mutate(doc, *mutation)


def _dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):  # a lone surrogate: write it as JSON (escaped)
        return json.dumps(doc)


BASE_MATRIX = {
    "name": "fuzz",
    "axes": {"model": ["srn-100k"], "world_size": [2], "bucket_cap_mb": [1, 25]},
    "defaults": {"steps": 4, "batch_size": 8},
    "microbench": {"sizes_bytes": [4096, 65536, 1048576]},
    "run": {"max_attempts": 2, "cell_timeout_s": 60},
    "env": {"NCCL_DEBUG": "INFO"},
    "repeats": 1,
}


def test_fuzz_matrix(tmp_path: Path) -> None:
    tally: Counter[str] = Counter()

    @SETTINGS
    @given(MUTATIONS)
    def check(mutation: tuple[list[int], Any, bool] | None) -> None:
        path = tmp_path / "m.yaml"
        path.write_text(_dump(_apply(BASE_MATRIX, mutation)), encoding="utf-8")
        _judge(tally, lambda: matrix.load(path))

    _tally("matrix", check, tally)


def test_fuzz_yaml_text() -> None:
    tally: Counter[str] = Counter()
    alphabet = st.sampled_from([*"ab1.e-+:[]{},&*!?<>|'\"#%@` \n\t\\", "\u2028", "\x00"])

    @SETTINGS
    @given(st.text(alphabet, max_size=80))
    def check(text: str) -> None:
        _judge(tally, lambda: load_yaml(text, "fuzz.yaml"))

    _tally("yaml text", check, tally)


def _bundled(name: str) -> Any:
    text = resources.files("commprof.modeling.collective").joinpath(name).read_text("utf-8")
    return load_yaml(text, name)


def test_fuzz_cluster_file(tmp_path: Path) -> None:
    tally: Counter[str] = Counter()
    base = {"clusters": _bundled("clusters.yaml")["clusters"][:1]}

    @SETTINGS
    @given(MUTATIONS)
    def check(mutation: tuple[list[int], Any, bool] | None) -> None:
        path = tmp_path / "c.yaml"
        path.write_text(_dump(_apply(base, mutation)), encoding="utf-8")

        def run() -> None:
            cluster = clusters.load_cluster(path)
            assert math.isfinite(cluster.nic_bytes_per_s) and cluster.intra_bytes_per_s > 0

        _judge(tally, run)

    _tally("cluster file", check, tally)


def test_fuzz_interconnect_file(tmp_path: Path) -> None:
    tally: Counter[str] = Counter()
    base = {"links": _bundled("interconnects.yaml")["links"][:1]}
    base["links"][0]["name"] = "fuzzed"

    @SETTINGS
    @given(MUTATIONS)
    def check(mutation: tuple[list[int], Any, bool] | None) -> None:
        path = tmp_path / "l.yaml"
        path.write_text(_dump(_apply(base, mutation)), encoding="utf-8")

        def run() -> None:
            for link in interconnects.load_interconnects(path).values():
                assert math.isfinite(link.per_direction_bytes_per_s)

        _judge(tally, run)

    _tally("interconnect file", check, tally)


def test_fuzz_parameter_file(tmp_path: Path) -> None:
    tally: Counter[str] = Counter()
    base = [{"name": "w", "numel": 1024, "dtype_bytes": 4}, {"name": "b", "numel": 32}]

    @SETTINGS
    @given(MUTATIONS)
    def check(mutation: tuple[list[int], Any, bool] | None) -> None:
        path = tmp_path / "p.yaml"
        path.write_text(_dump(_apply(base, mutation)), encoding="utf-8")

        def run() -> None:
            for name, numel, size in load_param_sizes_file(path):
                assert isinstance(name, str) and type(numel) is int and size in (1, 2, 4, 8)

        _judge(tally, run)

    _tally("parameter file", check, tally)


def test_fuzz_lock_file() -> None:
    tally: Counter[str] = Counter()
    good = {"host": "h", "boot_id": "b", "pid": 12, "pid_start": 3, "started_unix_s": 1.7e9,
            "token": "t"}  # fmt: skip

    @SETTINGS
    @given(st.one_of(st.binary(max_size=64), MUTATIONS.map(lambda m: _apply(good, m))))
    def check(data: Any) -> None:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        record = parse_record(raw)  # never raises: a damaged lock file is an empty record
        for key, value in record.items():
            assert key in good and isinstance(value, type(good[key]) | int)
        tally["accepted" if record else "refused"] += 1

    _tally("lock file", check, tally)


def _golden() -> list[dict[str, Any]]:
    return [
        json.loads(gzip.decompress((GOLDEN / f"rank{r}_steps2-4.json.gz").read_bytes()))
        for r in (0, 1)
    ]


KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")
TRACE_VALUES = VALUES | st.sampled_from(["X", "ProfilerStep#" + "9" * 40, "gloo:all_reduce"])


def test_fuzz_analyze_on_mutated_real_traces(tmp_path: Path) -> None:
    from commprof.traces.analyze import analyze

    tally: Counter[str] = Counter()
    docs = _golden()

    @settings(SETTINGS, max_examples=30)
    @given(
        st.integers(0, 1),
        st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(KEYS), TRACE_VALUES),
                 min_size=1, max_size=4),
    )  # fmt: skip
    def check(rank: int, edits: list[tuple[int, str, Any]]) -> None:
        doc = copy.deepcopy(docs[rank])
        events = doc["traceEvents"]
        for index, key, value in edits:
            events[index % len(events)][key] = value
        folder = tmp_path / "t"
        folder.mkdir(exist_ok=True)
        for r in (0, 1):
            (folder / f"rank{r}.json").write_text(json.dumps(doc if r == rank else docs[r]))
        _judge(tally, lambda: analyze(folder, workers=1))

    _tally("analyze (mutated golden traces)", check, tally)


@pytest.mark.parametrize("text", ["? [a, b]\n: 1\n", "a: &x 1\n<<: {b: 2}\n", "x: " + "9" * 400])
def test_the_fuzzed_yaml_cases_that_failed_before(text: str) -> None:
    with pytest.raises(ValueError, match="not valid YAML"):
        load_yaml(text, "t.yaml")
