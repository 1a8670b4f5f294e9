"""Every rank lined up: matching, clock offsets, skew and stragglers (closed form, real sets)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from commprof.traces.crossrank import (
    CrossRank,
    collective_groups,
    cross_rank,
    rank_collectives,
)
from commprof.traces.trace_parser import parse_trace
from tests.prereqs import REALTRACES, needs
from tests.trace_events import (
    DELAY_US,
    NCCL,
    OFFSET_US,
    TRANSFER_US,
    rank_trace,
    x,
)

REAL = REALTRACES
GOLDEN = Path(__file__).parent / "data" / "golden_gloo2"


def line_up(traces: list[dict[str, Any]], **kw: Any) -> CrossRank:
    parsed = [parse_trace(t) for t in traces]
    frame = pd.concat(
        [rank_collectives(p.collectives, p.rank, p.regime) for p in parsed], ignore_index=True
    )
    out = cross_rank(frame, **kw)
    assert out is not None
    return out


def us_to_ns(values: Any) -> list[int]:
    return np.rint(np.asarray(values) * 1000).astype(np.int64).tolist()


@pytest.mark.parametrize("seq", [True, False])
def test_injected_offsets_and_skew_closed_form(seq: bool) -> None:
    cr = line_up([rank_trace(r, seq=seq) for r in range(len(OFFSET_US))])
    assert cr.matched_by == {"pg 0": "seq" if seq else "step order"}
    assert cr.offsets["offset_ns"].tolist() == us_to_ns(np.array(OFFSET_US) - OFFSET_US[0])
    assert (cr.offsets["residual_max_ns"] == 0).all()  # ends exactly simultaneous
    colls = cr.collectives
    assert colls["skew_ns"].tolist() == us_to_ns(DELAY_US.max(0) - DELAY_US.min(0))
    assert colls["transfer_ns"].tolist() == us_to_ns(TRANSFER_US)
    wait = DELAY_US.max(0) - DELAY_US  # the others wait for the last to arrive
    assert colls["wait_ns"].tolist() == us_to_ns(wait.sum(0))
    last = DELAY_US.argmax(0)
    assert colls["last_rank"].tolist() == [*last[:3].tolist(), -1, last[4]]  # c=3: all tie
    per_rank = cr.per_rank.pivot(index="index", columns="rank", values="wait_ns")
    assert per_rank.to_numpy().T.tolist() == [us_to_ns(w) for w in wait]
    strag = cr.stragglers.set_index("rank")
    for r in range(len(OFFSET_US)):
        mine = [c for c in range(DELAY_US.shape[1]) if last[c] == r and wait[:, c].any()]
        assert strag.loc[r, "num_last"] == len(mine)
        assert strag.loc[r, "caused_wait_ns"] == sum(us_to_ns(wait[:, mine].sum(0)))
        assert strag.loc[r, "own_wait_ns"] == sum(us_to_ns(wait[r]))
    assert cr.stragglers["rank"].iloc[0] == 2  # 250 us late to the first collective


def test_skew_needs_the_alignment() -> None:
    cr = line_up([rank_trace(r) for r in range(len(OFFSET_US))], align=False)
    on_own_clocks = DELAY_US + np.array(OFFSET_US)[:, None]
    assert cr.collectives["skew_ns"].tolist() == us_to_ns(
        on_own_clocks.max(0) - on_own_clocks.min(0)
    )
    assert cr.offsets["offset_ns"].tolist() == us_to_ns(np.array(OFFSET_US))  # reported anyway


def test_link_latency_jitter_bounds_the_offsets() -> None:
    jitter_us = 0.8  # ends differ by up to 2 x 0.8 us between two ranks
    cr = line_up([rank_trace(r, jitter_us=jitter_us) for r in range(len(OFFSET_US))])
    error = cr.offsets["offset_ns"].to_numpy() - np.array(us_to_ns(OFFSET_US))
    assert np.abs(error).max() <= 2 * jitter_us * 1000
    # A residual holds the end's own jitter and the offset's error: at most 0.8 + 1.6 us.
    assert 0 < cr.offsets["residual_max_ns"].max() <= 3 * jitter_us * 1000


def test_streams_stand_in_for_missing_group_names() -> None:
    traces = [rank_trace(r, seq=False, stream=20 + 3 * r) for r in range(len(OFFSET_US))]
    for t in traces:
        for e in t["traceEvents"]:
            e["args"].pop("Process Group Name", None)
    cr = line_up(traces)
    assert cr.matched_by == {"stream #0": "step order"}
    assert cr.offsets["offset_ns"].tolist() == us_to_ns(np.array(OFFSET_US) - OFFSET_US[0])


def test_groups_by_name_stream_or_one_lane() -> None:
    colls = pd.DataFrame({
        "process_group": ["", "", "", "7"], "thread": [31, 24, 31, 24],
        "start_ns": [30, 10, 50, 60],
    })  # fmt: skip
    assert collective_groups(colls, "cuda-nccl").tolist() == [
        "stream #1", "stream #0", "stream #1", "pg 7",
    ]  # fmt: skip
    # gloo annotations run on whichever worker thread is free: the thread is no lane.
    assert collective_groups(colls, "cuda-gloo").tolist() == ["default"] * 3 + ["pg 7"]


def test_subgroup_and_reference_rank() -> None:
    traces = [rank_trace(r) for r in range(len(OFFSET_US))]
    for r in (2, 3):  # a second group of ranks 2 and 3 only: one more collective there
        args = {"Collective name": "allgather", "Process Group Name": "1", "Seq": 0}
        traces[r]["traceEvents"].append(x(NCCL, "kernel", 8000.0 + OFFSET_US[r], 50.0, 21, **args))
    cr = line_up(traces, reference_rank=3)
    assert cr.offsets["offset_ns"].tolist() == us_to_ns(np.array(OFFSET_US) - OFFSET_US[3])
    assert len(cr.collectives) == DELAY_US.shape[1] + 1
    assert cr.collectives.set_index("group").loc["pg 1", "num_ranks"] == 2
    with pytest.raises(ValueError, match="reference_rank 9"):
        line_up(traces, reference_rank=9)


def test_unmatched_and_missing_columns() -> None:
    traces = [rank_trace(r) for r in range(2)]
    traces[1]["traceEvents"].append(
        x(NCCL, "kernel", 8500.0, 10.0, 20, **{"Collective name": "allreduce", "Seq": 999})
    )
    assert line_up(traces).num_unmatched == 1
    with pytest.raises(ValueError, match="lacks columns"):
        cross_rank(pd.DataFrame({"rank": [0]}))


def _line_up_dir(folder: Path, pattern: str) -> CrossRank:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # real traces: steps without kernels and the like
        parsed = [parse_trace(p) for p in sorted(folder.glob(pattern))]
    out = cross_rank(pd.concat([rank_collectives(p.collectives, p.rank, p.regime) for p in parsed]))
    assert out is not None
    return out


@needs(REAL)
def test_real_param_dlrm_8_ranks() -> None:
    cr = _line_up_dir(REAL / "param_dlrm_8rank", "worker*.json")
    assert len(cr.offsets) == 8 and (cr.collectives["num_ranks"] == 8).all()
    assert len(cr.collectives) == 8 and cr.num_unmatched == 0 and cr.num_name_mismatches == 0
    # One host's clock: the estimated offsets and the end residuals stay within a few us,
    # three orders below the collectives' skew.
    assert cr.offsets["offset_ns"].abs().max() < 5_000
    assert cr.offsets["residual_max_ns"].max() < 5_000
    assert cr.summary()["skew_max_ns"] > 1_000_000 and not cr.matching_doubtful()


@needs(REAL)
def test_real_hta_sampled_2_of_128() -> None:
    cr = _line_up_dir(REAL / "hta_sampled_2of128", "sampled_rank-*.json.gz")
    assert sorted(cr.offsets["rank"]) == [0, 1]
    assert len(cr.collectives) == 10 and set(cr.matched_by) == {"stream #0", "stream #1"}
    # No sequence numbers, and SendRecv kernels (all-to-all over 128 ranks) whose ends need
    # not meet on two of the ranks: the aligned ends disagree by milliseconds, and it says so.
    assert cr.matching_doubtful()


def test_golden_gloo_two_ranks_one_clock() -> None:
    cr = _line_up_dir(GOLDEN, "rank*_steps*.json.gz")
    assert len(cr.collectives) == 3 * 3 and cr.matched_by == {"default": "step order"}
    # Both ranks ran on one host (true offset 0): the estimate is within the ends' spread.
    offset = int(cr.offsets.set_index("rank").loc[1, "offset_ns"])
    assert abs(offset) <= cr.offsets["residual_max_ns"].max() and not cr.matching_doubtful()
    assert (cr.per_rank.groupby(["step_key", "index"])["wait_ns"].min() == 0).all()


def test_the_shortest_duration_is_the_transfer() -> None:
    # Two collectives on two ranks that end together: the rank that came last waited nothing.
    frame = pd.DataFrame({
        "rank": [0, 1, 0, 1], "group": ["default"] * 4, "name": ["allreduce"] * 4,
        "start_ns": [0, 6, 12, 10], "end_ns": [10, 10, 19, 19],
        "seq": pd.array([None] * 4, dtype="Int64"), "step": pd.array([0] * 4, dtype="Int64"),
    }).assign(duration_ns=lambda f: f["end_ns"] - f["start_ns"])  # fmt: skip
    out = cross_rank(frame, align=False)
    assert out is not None
    first, second = (g.set_index("rank") for _, g in out.per_rank.groupby("index", sort=True))
    assert first["transfer_ns"].tolist() == [4, 4] and first["wait_ns"].tolist() == [10 - 4, 0]
    assert second["transfer_ns"].tolist() == [7, 7] and second["wait_ns"].tolist() == [0, 9 - 7]
