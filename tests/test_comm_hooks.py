"""Timing hook on a real 2-rank gloo group: exact gradients, bucket layout, timestamps, resolve().

All scenarios run in ONE spawn of two ranks (process start and ``import torch`` dominate the
cost); the ranks only collect data and every assertion is made here, in the test process, from
what they returned. Model: ``srn-100k`` (18 parameters, 99,912 float32 elements).
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from commprof.profiling.comm_hooks import (
    COMPOSITION_STEP,
    TimingState,
    _derive,
    allreduce_unwrapped,
    register_timing_hook,
    timing_wrapper,
)
from commprof.training.data import loss_fn, make_batch
from commprof.training.launcher import process_group, spawn_ranks
from commprof.training.models import build_model, count_parameters
from tests.hang import GUARD_S

WORLD_SIZE = 2
MODEL = "srn-100k"
MODEL_BYTES = count_parameters(MODEL) * 4  # float32 parameters
BATCH_SIZE = 4
NUM_STEPS = 4
GRAD_CAP_MB = 0.1  # several buckets after the rebuild, so the hook runs more than once a step
CAPS_MB = (0.01, 0.1, 1.0)  # ascending; 1 MiB holds the whole 0.38 MiB model in one bucket
PG_TIMEOUT_S = 120.0  # generous: the test machine is heavily shared


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Rank-seeded batches: every rank's local gradient differs, so the reduction is visible.
    return make_batch(MODEL, BATCH_SIZE, rank=rank, seed=0, step=step)


def _ddp(bucket_cap_mb: float) -> DistributedDataParallel:
    torch.manual_seed(0)  # identical initial weights in every model and rank
    return DistributedDataParallel(build_model(MODEL), bucket_cap_mb=bucket_cap_mb)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _train(
    models: dict[str, DistributedDataParallel],
    states: dict[str, TimingState],
    rank: int,
) -> dict[str, list[list[torch.Tensor]]]:
    """NUM_STEPS SGD steps of every model on the same batches; gradients per model and step."""
    criterion = loss_fn(MODEL)
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    grads: dict[str, list[list[torch.Tensor]]] = {k: [] for k in models}
    grads["local"] = []  # this rank's own, unreduced gradient of the "plain" model's weights
    for step in range(NUM_STEPS):
        inputs, targets = _batch(rank, step)
        local = copy.deepcopy(models["plain"].module)
        local.zero_grad(set_to_none=True)
        criterion(local(inputs), targets).backward()
        grads["local"].append(_grads(local))
        for name, model in models.items():
            if name in states:
                states[name].step = step
            optimizers[name].zero_grad(set_to_none=True)
            criterion(model(inputs), targets).backward()
            grads[name].append(_grads(model))
            optimizers[name].step()
            if name in states:
                states[name].resolve()
    return grads


def _scenario_gradients(rank: int) -> dict[str, Any]:
    models = {
        "plain": _ddp(GRAD_CAP_MB),  # no hook: DDP's built-in all-reduce
        "timed": _ddp(GRAD_CAP_MB),
        "fp16": _ddp(GRAD_CAP_MB),
        "timed_fp16": _ddp(GRAD_CAP_MB),
        "timed_as_is": _ddp(GRAD_CAP_MB),
    }
    models["fp16"].register_comm_hook(None, default_hooks.fp16_compress_hook)
    states = {
        "timed": register_timing_hook(models["timed"], inner="allreduce"),
        "timed_fp16": register_timing_hook(models["timed_fp16"], inner="fp16"),
        "timed_as_is": TimingState(None),
    }
    # allreduce_hook behind another name: the wrapper runs it as it is, two callbacks a bucket.
    models["timed_as_is"].register_comm_hook(
        states["timed_as_is"],
        timing_wrapper(lambda group, bucket: default_hooks.allreduce_hook(group, bucket)),
    )
    unwrapped = allreduce_unwrapped(None, _DoneBucket(0, torch.full((3,), float(rank + 1))))
    return {"grads": _train(models, states, rank), "unwrapped": unwrapped.wait()}


def _scenario_buckets(rank: int) -> dict[float, Any]:
    criterion = loss_fn(MODEL)
    out: dict[float, Any] = {}
    for cap_mb in CAPS_MB:
        ddp = _ddp(cap_mb)
        state = register_timing_hook(ddp)
        rows = []
        for step in range(NUM_STEPS):
            state.step = step
            inputs, targets = _batch(rank, step)
            criterion(ddp(inputs), targets).backward()
            rows.extend(state.resolve())
        out[cap_mb] = {
            "rows": rows,
            "logging": ddp._get_ddp_logging_data(),
            "composition": list(state.composition),
            "params": [
                (n, p.numel(), p.numel() * p.element_size())
                for n, p in ddp.module.named_parameters()
            ],
            "raw_after": len(state.raw),
            "resolve_again": state.resolve(),
        }
    return out


class _DeferFirstBucket:
    """Inner hook that, on one step, leaves bucket 0's future pending until bucket 1's hook.

    Bucket 1's hook first calls ``resolve()`` (bucket 0 is launched but not done: it must
    raise), then completes bucket 0 and all-reduces itself. Buckets launch in index order, so
    this is deterministic. The all-reduce of bucket 0 runs synchronously in the hook (the
    main thread), never in a ``then`` callback.
    """

    def __init__(self, defer_step: int) -> None:
        self.defer_step = defer_step
        self.timing: TimingState | None = None
        self.pending: tuple[torch.futures.Future[torch.Tensor], torch.Tensor] | None = None
        self.error: str | None = None
        self.__name__ = "defer_first_bucket"

    def __call__(self, _state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        assert self.timing is not None
        if self.timing.step == self.defer_step and bucket.index() == 0:
            buffer = bucket.buffer()
            dist.all_reduce(buffer)
            buffer.div_(WORLD_SIZE)
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            self.pending = (fut, buffer)
            return fut
        if self.timing.step == self.defer_step and bucket.index() == 1:
            try:
                self.timing.resolve()
            except RuntimeError as err:
                self.error = str(err)
            assert self.pending is not None
            pending_fut, buffer = self.pending
            pending_fut.set_result(buffer)
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


def _scenario_pending(rank: int) -> dict[str, Any]:
    criterion = loss_fn(MODEL)
    defer_step = COMPOSITION_STEP + 1  # after the rebuild: several buckets
    ddp = _ddp(GRAD_CAP_MB)
    inner = _DeferFirstBucket(defer_step)
    state = TimingState(None)
    inner.timing = state
    ddp.register_comm_hook(state, timing_wrapper(inner))
    rows_by_step = {}
    for step in range(defer_step + 1):
        state.step = step
        inputs, targets = _batch(rank, step)
        criterion(ddp(inputs), targets).backward()
        rows_by_step[step] = state.resolve()
    return {
        "error": inner.error,
        "rows": rows_by_step[defer_step],
        "num_buckets": len(rows_by_step[COMPOSITION_STEP]),
    }


SCENARIOS: dict[str, Callable[[int], dict[Any, Any]]] = {
    "gradients": _scenario_gradients,
    "buckets": _scenario_buckets,
    "pending": _scenario_pending,
}


def _convert(value: Any, kind: type, to: Callable[[Any], Any]) -> Any:
    """Convert every ``kind`` inside nested dicts, lists and tuples with ``to``."""
    if isinstance(value, kind):
        return to(value)
    if isinstance(value, dict):
        return {k: _convert(v, kind, to) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_convert(v, kind, to) for v in value)
    return value


def _worker(rank: int, world_size: int, store_path: str) -> dict[str, Any]:  # pragma: no cover
    store = dist.FileStore(store_path, world_size)
    results: dict[str, Any] = {}
    with process_group(
        backend="gloo", rank=rank, world_size=world_size, store=store, timeout_s=PG_TIMEOUT_S
    ):
        for name, scenario in SCENARIOS.items():
            try:
                results[name] = scenario(rank)
            except Exception:  # reported by the test of that scenario
                results[name] = {"traceback": traceback.format_exc()}
            dist.barrier()  # both ranks finish a scenario before the next one starts
    # numpy travels by value through the result queue (tensors would go by shared memory)
    return _convert(results, torch.Tensor, lambda t: t.numpy())


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    """What each of the two ranks returned, by scenario (a real 2-rank run: its tests are in the
    slow tier)."""
    per_rank = spawn_ranks(_worker, WORLD_SIZE, limit_s=GUARD_S)
    return [_convert(r, np.ndarray, torch.from_numpy) for r in per_rank]


def _scenario(ranks: list[dict[str, Any]], name: str) -> list[Any]:
    for rank, result in enumerate(ranks):
        if "traceback" in result[name]:
            pytest.fail(f"scenario {name} failed on rank {rank}:\n{result[name]['traceback']}")
    return [result[name] for result in ranks]


def _assert_all_equal(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    assert len(got) == len(want) == NUM_STEPS
    for step, (g_step, w_step) in enumerate(zip(got, want, strict=True)):
        assert len(g_step) == len(w_step) == 18
        for i, (g, w) in enumerate(zip(g_step, w_step, strict=True)):
            assert torch.equal(g, w), (
                f"step {step}, parameter {i}: max |diff| {(g - w).abs().max()}"
            )


@pytest.mark.slow
def test_timed_allreduce_gradients_equal_unhooked_exactly(ranks: list[dict[str, Any]]) -> None:
    per_rank = [r["grads"] for r in _scenario(ranks, "gradients")]
    for grads in per_rank:
        _assert_all_equal(grads["timed"], grads["plain"])
    # Rank-seeded batches give different local gradients, and the reduction makes them equal.
    assert not torch.equal(per_rank[0]["local"][0][0], per_rank[1]["local"][0][0])
    _assert_all_equal(per_rank[0]["plain"], per_rank[1]["plain"])
    # Closed form: the reduced gradient is the mean of the local ones. Exact (atol=0) for two
    # ranks: halving is exact in binary floating point and a + b is one correctly rounded add.
    want = [
        [(g0 + g1) / 2 for g0, g1 in zip(s0, s1, strict=True)]
        for s0, s1 in zip(per_rank[0]["local"], per_rank[1]["local"], strict=True)
    ]
    _assert_all_equal(per_rank[0]["timed"], want)


@pytest.mark.slow
def test_allreduce_unwrapped_gives_the_mean_as_a_list_and_either_wrapper_form_is_exact(
    ranks: list[dict[str, Any]],
) -> None:
    per_rank = _scenario(ranks, "gradients")
    for out in per_rank:
        # (1 + 2) / 2 on every rank, still in the work's list: the wrapper's callback unwraps it.
        assert isinstance(out["unwrapped"], list) and len(out["unwrapped"]) == 1
        assert torch.equal(out["unwrapped"][0], torch.full((3,), (1 + 2) / WORLD_SIZE))
        _assert_all_equal(out["grads"]["timed_as_is"], out["grads"]["plain"])


@pytest.mark.slow
def test_timed_fp16_gradients_equal_plain_fp16_hook_exactly(ranks: list[dict[str, Any]]) -> None:
    per_rank = [r["grads"] for r in _scenario(ranks, "gradients")]
    for grads in per_rank:
        _assert_all_equal(grads["timed_fp16"], grads["fp16"])
    _assert_all_equal(per_rank[0]["timed_fp16"], per_rank[1]["timed_fp16"])
    # fp16 compression is visible: the compressed gradient differs from the fp32 one.
    assert not all(
        torch.equal(a, b)
        for a, b in zip(per_rank[0]["fp16"][0], per_rank[0]["plain"][0], strict=True)
    )


def _by_step(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    steps: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        steps.setdefault(row["step"], []).append(row)
    return {s: sorted(r, key=lambda row: row["bucket_index"]) for s, r in steps.items()}


def _sizes(text: str) -> list[int]:
    return [int(s) for s in text.split(",")]


@pytest.mark.slow
def test_step0_has_one_bucket_then_ddp_rebuilt_layout(ranks: list[dict[str, Any]]) -> None:
    num_buckets = []
    for cap_mb in CAPS_MB:
        for result in _scenario(ranks, "buckets"):
            data = result[cap_mb]
            logging = data["logging"]
            steps = _by_step(data["rows"])
            assert sorted(steps) == list(range(NUM_STEPS))
            # Step 0: the whole model in one bucket (DDP disables bucketing before the rebuild).
            assert (
                [r["num_bytes"] for r in steps[0]]
                == [MODEL_BYTES]
                == _sizes(logging["bucket_sizes"])
            )
            assert steps[0][0]["num_params"] == 18
            assert logging["has_rebuilt_buckets"] == 1
            rebuilt = _sizes(logging["rebuilt_bucket_sizes"])
            assert sum(rebuilt) == MODEL_BYTES
            for step in range(1, NUM_STEPS):
                assert [r["bucket_index"] for r in steps[step]] == list(range(len(rebuilt)))
                assert [r["num_bytes"] for r in steps[step]] == rebuilt
            per_bucket_params = [
                len(b.split()) for b in logging["rebuilt_per_bucket_param_indices"].split(",")
            ]
            for step in range(1, NUM_STEPS):
                assert [r["num_params"] for r in steps[step]] == per_bucket_params
        num_buckets.append(len(rebuilt))
    # Larger caps give strictly fewer buckets; 1 MiB holds the whole model.
    assert num_buckets == sorted(num_buckets, reverse=True)
    assert len(set(num_buckets)) == len(CAPS_MB)
    assert num_buckets[-1] == 1


@pytest.mark.slow
def test_composition_covers_every_parameter_once(ranks: list[dict[str, Any]]) -> None:
    for result in _scenario(ranks, "buckets"):
        for cap_mb in CAPS_MB:
            data = result[cap_mb]
            comp = data["composition"]
            names = [n for n, _, _ in data["params"]]
            assert sorted(p.param_name for p in comp) == sorted(names)  # each exactly once
            sizes = {n: (numel, nbytes) for n, numel, nbytes in data["params"]}
            for p in comp:
                assert (p.numel, p.num_bytes) == sizes[p.param_name]
                assert p.num_bytes == 4 * p.numel
                assert p.module == p.param_name.rpartition(".")[0]
            # Bucket by bucket, in position order, the parameters DDP reports for the rebuild.
            indices = data["logging"]["rebuilt_per_bucket_param_indices"].split(",")
            rows = _by_step(data["rows"])[COMPOSITION_STEP]
            for b, text in enumerate(indices):
                in_bucket = sorted(
                    (p for p in comp if p.bucket_index == b), key=lambda p: p.position
                )
                assert [p.position for p in in_bucket] == list(range(len(in_bucket)))
                assert [p.param_name for p in in_bucket] == [names[int(i)] for i in text.split()]
                assert sum(p.num_bytes for p in in_bucket) == rows[b]["num_bytes"]


@pytest.mark.slow
def test_timestamps_latency_transfer_and_exposed(ranks: list[dict[str, Any]]) -> None:
    for result in _scenario(ranks, "buckets"):
        for cap_mb in CAPS_MB:
            for step, rows in _by_step(result[cap_mb]["rows"]).items():
                # The step's backward compute ends when its last bucket is ready (comm_hooks).
                compute_end_ns = max(r["ready_ns"] for r in rows)
                for r in rows:
                    assert 0 < r["ready_ns"] <= r["launch_ns"] <= r["done_ns"], (step, r)
                    assert r["latency_ns"] == r["done_ns"] - r["ready_ns"]
                    start_ns = max(r["ready_ns"], compute_end_ns)
                    assert r["exposed_ns"] == max(0, r["done_ns"] - start_ns)
                    assert 0 <= r["exposed_ns"] <= r["latency_ns"]
                    assert r["device_latency_ns"] is None  # CPU: no CUDA events
                # Buckets launch in index order; the last-ready one overlaps nothing.
                ready = [r["ready_ns"] for r in rows]
                assert ready == sorted(ready)
                last = rows[-1]
                assert last["ready_ns"] == compute_end_ns
                assert last["exposed_ns"] == last["latency_ns"]
                # transfer: from ready, or from the latest completion of an earlier-ready bucket
                # that finished before this one, until done (comm_hooks docstring).
                for i, r in enumerate(rows):
                    before = [q["done_ns"] for q in rows[:i] if q["done_ns"] <= r["done_ns"]]
                    assert r["transfer_ns"] == r["done_ns"] - max([r["ready_ns"], *before])
                    assert 0 <= r["transfer_ns"] <= r["latency_ns"]
                assert rows[0]["transfer_ns"] == rows[0]["latency_ns"]


def test_derived_times_in_closed_form() -> None:
    # One step, buckets by readiness: a [0, 10); b [2, 15) waits for a; c [3, 12) is served by
    # gloo's second thread beside b and waits for a only (b, though earlier, finished later);
    # d [20, 30) is the last ready (compute ends at 20) and waits for none that ends after 20.
    times = [(0, 10), (2, 15), (3, 12), (20, 30)]
    latency, transfer, exposed = zip(*_derive(times, [2] * len(times)), strict=True)
    assert latency == (10, 13, 9, 10)
    assert transfer == (10 - 0, 15 - max(2, 10), 12 - max(3, 10), 30 - 20)
    assert exposed == (0, 0, 0, 30 - 20)


@pytest.mark.slow
def test_resolve_forgets_raw_records(ranks: list[dict[str, Any]]) -> None:
    for result in _scenario(ranks, "buckets"):
        for cap_mb in CAPS_MB:
            assert result[cap_mb]["raw_after"] == 0
            assert result[cap_mb]["resolve_again"] == []


@pytest.mark.slow
def test_resolve_before_completion_raises_and_keeps_records(
    ranks: list[dict[str, Any]],
) -> None:
    for result in _scenario(ranks, "pending"):
        assert result["error"] is not None, "resolve() with a pending bucket did not raise"
        assert "bucket 0 of step 2 has not completed" in result["error"]
        # The failed resolve() must not lose the step's records: all buckets come back later.
        assert result["num_buckets"] >= 2
        rows = result["rows"]
        assert [r["bucket_index"] for r in rows] == list(range(result["num_buckets"]))
        assert all(r["ready_ns"] <= r["launch_ns"] <= r["done_ns"] for r in rows)


class _DoneBucket:
    """A bucket outside DDP (its buffer given or ones): the three methods the wrapper calls."""

    def __init__(self, index: int, buffer: torch.Tensor | None = None) -> None:
        self._index, self._buffer = index, torch.ones(4) if buffer is None else buffer

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list[torch.Tensor]:
        return [self._buffer]


def _completed(_state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def test_resolve_before_a_step_keeps_later_records_and_recording_off_passes_through() -> None:
    from commprof.profiling.comm_hooks import TimingState, timing_wrapper

    state = TimingState(None)
    hook = timing_wrapper(_completed)
    for step in (0, 1, 2):
        state.step = step
        for index in (0, 1):
            assert torch.equal(hook(state, _DoneBucket(index)).wait(), torch.ones(4))
    last_done, never = state.last_done_ns(1), state.last_done_ns(7)
    assert state.device_done(2)  # no CUDA events: nothing to wait for
    early = state.resolve(before_step=2)
    assert [(r["step"], r["bucket_index"]) for r in early] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert last_done == max(r["done_ns"] for r in early if r["step"] == 1) and never is None
    assert len(state.raw) == 2  # step 2's two buckets, kept for a later resolve
    state.recording = False
    state.step = 3
    assert torch.equal(hook(state, _DoneBucket(0)).wait(), torch.ones(4))  # passed through
    assert [r["step"] for r in state.resolve()] == [2, 2]


def test_the_wrapper_runs_allreduce_hook_unwrapped_with_one_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from commprof.profiling import comm_hooks

    calls: list[Any] = []

    def unwrapped(group: Any, bucket: Any) -> torch.futures.Future[list[torch.Tensor]]:
        calls.append(group)
        fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        fut.set_result([bucket.buffer() * 2])  # a work's value: a one-tensor list
        return fut

    monkeypatch.setattr(comm_hooks, "allreduce_unwrapped", unwrapped)
    state = TimingState("group")
    fut = timing_wrapper(default_hooks.allreduce_hook)(state, _DoneBucket(0))  # type: ignore[arg-type]
    assert calls == ["group"]  # the inner state is passed on
    assert torch.equal(fut.wait(), torch.full((4,), 2.0))  # the one callback unwrapped it
    (row,) = state.resolve()
    assert row["done_ns"] >= row["launch_ns"] >= row["ready_ns"]
    # Any other hook runs as it is: its future's value is returned untouched.
    other = timing_wrapper(_completed)(state, _DoneBucket(1))  # type: ignore[arg-type]
    assert torch.equal(other.wait(), torch.ones(4)) and calls == ["group"]
