"""Every rank lined up: collectives matched across ranks, clock offsets, skew and stragglers.

A collective is one call that every rank of its process group makes; it ends on all of them
together (up to the link's latency), however late each rank arrived. This module matches the
rows of :attr:`commprof.traces.trace_parser.ParsedTrace.collectives` across ranks, estimates
each rank's clock offset from the matched ends, and, on the aligned clocks, measures per
collective

- arrival skew = max over ranks of the start - min over ranks of the start,
- transfer = the shortest duration across ranks (the last to arrive waits for nobody),
- wait of a rank = its duration - transfer,

and per rank how often it arrived last and the wait that caused the others (the sum of the
other ranks' waits in the collectives it arrived last to). Pure numpy and pandas.

Matching (docs/design.md, Cross-rank): the key is (group, index). The group is the process
group's name from the collective's args; where a trace has none, on device traces it is the
CUDA stream the kernel ran on (NCCL runs each communicator on a stream of its own), numbered by
first use on each rank since stream ids differ between processes, and on host traces one group.
The index is the sequence number (Kineto's ``Seq``, newer ``seq_num``) where every collective
of the group has one, else the position within the group and step (ProfilerStep#N is the same
iteration on every rank), else the position within the group.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

KEY = ["group", "step_key", "index"]
"""Columns that identify one collective across ranks."""
DOUBTFUL_RESIDUAL = 0.25
"""Median end residual, as a share of the median transfer, past which matching is doubtful."""
STREAM_REGIMES = frozenset({"cuda-nccl"})
"""Regimes whose collectives are device kernels, ``thread`` their stream (in cuda-gloo they are
host annotations on whichever gloo worker thread was free: no lane)."""
NO_STEP = -1
"""``step_key`` where the index does not depend on the step (sequence numbers, trace order)."""


def collective_groups(collectives: pd.DataFrame, regime: str) -> pd.Series:
    """The matching group of each of one rank's collectives (see the module docstring).

    Args:
        collectives: One rank's ``ParsedTrace.collectives`` (process_group, start_ns; thread).
        regime: The trace's regime; in STREAM_REGIMES the stream (``thread``) stands in for
            a missing process group name.

    Returns:
        A string Series aligned with ``collectives``: ``"pg <name>"``, ``"stream #<i>"`` (i: order
        of the stream's first collective on this rank) or ``"default"``.
    """
    pg = collectives["process_group"].fillna("").astype(str)
    out = "pg " + pg
    missing = pg == ""
    if not missing.any():
        return out
    if regime in STREAM_REGIMES and "thread" in collectives.columns:
        first = collectives[missing].groupby("thread")["start_ns"].min().sort_values(kind="stable")
        number = {t: i for i, t in enumerate(first.index)}
        lanes = collectives.loc[missing, "thread"].map(number)
        out[missing] = "stream #" + lanes.astype(str)
    else:
        out[missing] = "default"
    return out


def match_collectives(collectives: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Give every collective its cross-rank key; keep those seen on two ranks or more.

    Args:
        collectives: Every rank's collectives in one table with columns rank, group, name,
            start_ns, end_ns, seq, step.

    Returns:
        (matched rows with KEY columns added, how each group was matched: "seq",
        "step order" or "order").
    """
    f = collectives.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)
    f["step_key"] = np.int64(NO_STEP)
    f["index"] = np.int64(0)
    how: dict[str, str] = {}
    for group, rows in f.groupby("group", sort=True).groups.items():
        part = f.loc[rows]
        if part["seq"].notna().all():
            how[str(group)] = "seq"
            f.loc[rows, "index"] = part["seq"].astype(np.int64).to_numpy()
        elif part["step"].notna().all():
            how[str(group)] = "step order"
            f.loc[rows, "step_key"] = part["step"].astype(np.int64).to_numpy()
            f.loc[rows, "index"] = part.groupby(["rank", "step"]).cumcount().to_numpy()
        else:
            how[str(group)] = "order"
            f.loc[rows, "index"] = part.groupby("rank").cumcount().to_numpy()
    f = f.drop_duplicates([*KEY, "rank"], keep="first")
    num_ranks = f.groupby(KEY)["rank"].transform("size")
    return f[num_ranks >= 2].reset_index(drop=True), how


def _components(ranks: list[int], pairs: list[tuple[int, int]]) -> dict[int, int]:
    """Connected components of ranks linked by shared collectives: rank -> component root."""
    root = {r: r for r in ranks}

    def find(r: int) -> int:
        while root[r] != r:
            root[r] = root[root[r]]
            r = root[r]
        return r

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            root[max(ra, rb)] = min(ra, rb)
    return {r: find(r) for r in ranks}


def clock_offsets(matched: pd.DataFrame, reference_rank: int) -> pd.Series:
    """Each rank's clock minus the reference rank's clock (ns), from matched collective ends.

    A collective ends on every rank at once, so end_r - end_a estimates o_r - o_a for any two
    ranks r, a of it. For each pair (rank, lowest rank of the collective) the median of those
    differences over their shared collectives is one equation o_r - o_a = d, weighted by the
    square root of its count; with o_ref = 0 the equations are solved by least squares. A set
    of ranks that shares no collective with the reference is anchored at its lowest rank (and
    warned about): its offsets are relative to that rank only.

    Args:
        matched: Output of :func:`match_collectives` (rank, end_ns and the KEY columns).
        reference_rank: The rank whose clock the others are aligned to.

    Returns:
        Offsets in int64 ns indexed by rank (0 for the reference).
    """
    ranks = sorted(int(r) for r in matched["rank"].unique())
    f = matched.sort_values([*KEY, "rank"], kind="stable")
    grouped = f.groupby(KEY, sort=False)
    anchor = grouped["rank"].transform("first")
    diff = f["end_ns"] - grouped["end_ns"].transform("first")
    own = f["rank"] != anchor
    pairs = (
        pd.DataFrame({"rank": f["rank"][own], "anchor": anchor[own], "diff": diff[own]})
        .groupby(["rank", "anchor"])["diff"]
        .agg(["median", "size"])
        .reset_index()
    )
    roots = _components(ranks, list(zip(pairs["rank"], pairs["anchor"], strict=True)))
    col = {r: i for i, r in enumerate(ranks)}
    rows, rhs = [], []
    for r, a, d, n in pairs.itertuples(index=False):
        row = np.zeros(len(ranks))
        row[col[r]], row[col[a]] = np.sqrt(n), -np.sqrt(n)
        rows.append(row)
        rhs.append(np.sqrt(n) * d)
    anchors = sorted(set(roots.values()))
    ref_root = roots.get(reference_rank, reference_rank)
    for root in anchors:  # pin each component: the reference, else its lowest rank
        row = np.zeros(len(ranks))
        row[col[reference_rank if root == ref_root else root]] = 1e6
        rows.append(row)
        rhs.append(0.0)
    if len(anchors) > 1:
        warnings.warn(
            f"ranks fall into {len(anchors)} sets that share no collective; clock offsets "
            f"are relative to each set's lowest rank ({anchors})",
            stacklevel=2,
        )
    solution = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]
    return pd.Series(np.rint(solution).astype(np.int64), index=pd.Index(ranks, name="rank"))


@dataclass(frozen=True, kw_only=True, slots=True)
class CrossRank:
    """Collectives of several ranks lined up on one clock (see the module docstring)."""

    reference_rank: int
    """Rank whose clock the others are aligned to (the lowest matched rank)."""
    matched_by: dict[str, str]
    """How each group's collectives were matched: "seq", "step order" or "order"."""
    num_unmatched: int
    """Collectives seen on one rank only (left out)."""
    num_name_mismatches: int
    """Matched collectives whose name differs between ranks (a sign of order gone wrong)."""
    offsets: pd.DataFrame = field(repr=False)
    """One row per rank: rank, offset_ns (its clock minus the reference's), num_collectives,
    residual_p50_ns and residual_max_ns (|aligned end - the collective's median aligned end|)."""
    per_rank: pd.DataFrame = field(repr=False)
    """One row per (collective, rank): KEY, rank, name, start_ns and end_ns on the reference
    clock, duration_ns, transfer_ns, wait_ns."""
    collectives: pd.DataFrame = field(repr=False)
    """One row per collective: KEY, name, num_ranks, start_ns (first arrival), skew_ns,
    transfer_ns, wait_ns (sum over ranks), last_rank (-1 where all arrived together)."""
    stragglers: pd.DataFrame = field(repr=False)
    """One row per rank, most harmful first: rank, num_collectives, num_last, last_share,
    caused_wait_ns, own_wait_ns."""

    def summary(self) -> dict[str, int | float]:
        """Skew, transfer, wait and residual totals (ns) over every matched collective."""
        skew = self.collectives["skew_ns"].to_numpy(np.int64)
        residual = self.offsets["residual_max_ns"].to_numpy(np.int64)
        return {
            "num_ranks": len(self.offsets),
            "num_collectives": len(self.collectives),
            "num_unmatched": self.num_unmatched,
            "num_name_mismatches": self.num_name_mismatches,
            "skew_p50_ns": int(np.median(skew)) if skew.size else 0,
            "skew_p95_ns": int(np.percentile(skew, 95)) if skew.size else 0,
            "skew_max_ns": int(skew.max()) if skew.size else 0,
            "transfer_ns": int(self.collectives["transfer_ns"].sum()),
            "wait_ns": int(self.collectives["wait_ns"].sum()),
            "residual_p50_ns": int(self.offsets["residual_p50_ns"].median()),
            "residual_max_ns": int(residual.max()) if residual.size else 0,
            "matching_doubtful": self.matching_doubtful(),
        }

    def matching_doubtful(self) -> bool:
        """Whether the aligned ends disagree by more than DOUBTFUL_RESIDUAL of a transfer.

        Ends of one collective meet within the link's latency; a median residual that is a
        sizeable share of the median transfer says that matching by order paired different
        calls (traces without sequence numbers whose ranks saw different collectives).
        """
        transfer = float(self.collectives["transfer_ns"].median())
        residual = float(self.offsets["residual_p50_ns"].median())
        return residual > DOUBTFUL_RESIDUAL * transfer


def _per_collective(m: pd.DataFrame) -> pd.DataFrame:
    """Add transfer_ns and wait_ns to ``m`` (in place); one row per collective, KEY index."""
    grouped = m.groupby(KEY, sort=True)
    m["transfer_ns"] = grouped["duration_ns"].transform("min")
    m["wait_ns"] = m["duration_ns"] - m["transfer_ns"]
    colls = grouped.agg(
        name=("name", "first"),
        num_names=("name", "nunique"),
        num_ranks=("rank", "size"),
        start_ns=("start_ns", "min"),
        last_start_ns=("start_ns", "max"),
        transfer_ns=("transfer_ns", "first"),
        wait_ns=("wait_ns", "sum"),
    )
    colls["skew_ns"] = colls["last_start_ns"] - colls["start_ns"]
    # The last to arrive: the latest start (ties: the lowest rank); nobody where all tie.
    last = m.loc[grouped["start_ns"].idxmax(), [*KEY, "rank"]].set_index(KEY)["rank"]
    colls["last_rank"] = np.where(colls["skew_ns"] > 0, last.reindex(colls.index), -1)
    return colls


def _offset_table(offsets: pd.Series, matched: pd.DataFrame, on_ref: pd.Series) -> pd.DataFrame:
    """Offsets with their residual: |end on the reference clock - the collective's median|."""
    median = on_ref.groupby([matched[k] for k in KEY]).transform("median")
    residual = pd.DataFrame({"rank": matched["rank"], "residual": (on_ref - median).abs()})
    stats = residual.groupby("rank")["residual"].agg(["size", "median", "max"])
    stats = stats.reindex(offsets.index)
    return pd.DataFrame({
        "rank": offsets.index.to_numpy(np.int64),
        "offset_ns": offsets.to_numpy(np.int64),
        "num_collectives": stats["size"].to_numpy(np.int64),
        "residual_p50_ns": np.rint(stats["median"].to_numpy(float)).astype(np.int64),
        "residual_max_ns": np.rint(stats["max"].to_numpy(float)).astype(np.int64),
    })  # fmt: skip


def _stragglers(per_rank: pd.DataFrame, colls: pd.DataFrame) -> pd.DataFrame:
    """Per rank: collectives attended, times last to arrive, wait caused and wait suffered."""
    late = colls[colls["last_rank"] >= 0]
    num_last = late.groupby("last_rank").size()
    rows = per_rank.merge(late[[*KEY, "last_rank"]], on=KEY)
    others = rows[rows["rank"] != rows["last_rank"]]  # the wait of everyone but the latecomer
    caused = others.groupby("last_rank")["wait_ns"].sum()
    own = per_rank.groupby("rank").agg(
        num_collectives=("wait_ns", "size"), own_wait_ns=("wait_ns", "sum")
    )
    own["num_last"] = num_last.reindex(own.index, fill_value=0).astype(np.int64)
    own["last_share"] = own["num_last"] / own["num_collectives"]
    own["caused_wait_ns"] = caused.reindex(own.index, fill_value=0).astype(np.int64)
    cols = ["num_collectives", "num_last", "last_share", "caused_wait_ns", "own_wait_ns"]
    out = own[cols].reset_index()
    return out.sort_values(
        ["caused_wait_ns", "num_last", "rank"], ascending=[False, False, True], kind="stable"
    ).reset_index(drop=True)


def cross_rank(
    collectives: pd.DataFrame, *, align: bool = True, reference_rank: int | None = None
) -> CrossRank | None:
    """Line up the collectives of several ranks (see the module docstring for the figures).

    Args:
        collectives: Every rank's collectives in one table: rank, group (from
            :func:`collective_groups`), name, start_ns, end_ns, duration_ns, seq, step.
        align: Shift each rank's times by its estimated clock offset first (offsets are
            reported either way).
        reference_rank: Rank of the reference clock (default: the lowest matched rank).

    Returns:
        The :class:`CrossRank`, or None where no collective is seen on two ranks.

    Raises:
        ValueError: If a required column is missing or ``reference_rank`` attended nothing.
    """
    need = {"rank", "group", "name", "start_ns", "end_ns", "duration_ns", "seq", "step"}
    missing = need - set(collectives.columns)
    if missing:
        raise ValueError(f"collectives lacks columns {sorted(missing)}")
    matched, how = match_collectives(collectives)
    if matched.empty:
        return None
    ref = int(matched["rank"].min()) if reference_rank is None else reference_rank
    if ref not in set(matched["rank"].tolist()):
        raise ValueError(f"reference_rank {ref} has no collective matched on another rank")
    offsets = clock_offsets(matched, ref)
    on_ref_clock = matched["end_ns"] - matched["rank"].map(offsets)
    shift = matched["rank"].map(offsets) if align else 0
    m = matched.assign(start_ns=matched["start_ns"] - shift, end_ns=matched["end_ns"] - shift)
    colls = _per_collective(m)
    offsets_frame = _offset_table(offsets, matched, on_ref_clock)
    per_rank_cols = [*KEY, "rank", "name", "start_ns", "end_ns", "duration_ns"]
    per_rank = m[[*per_rank_cols, "transfer_ns", "wait_ns"]].sort_values([*KEY, "rank"])
    coll_cols = ["name", "num_ranks", "start_ns", "skew_ns", "transfer_ns", "wait_ns", "last_rank"]
    return CrossRank(
        reference_rank=ref,
        matched_by=how,
        num_unmatched=int(len(collectives) - len(matched)),
        num_name_mismatches=int((colls["num_names"] > 1).sum()),
        offsets=offsets_frame,
        per_rank=per_rank.reset_index(drop=True),
        collectives=colls[coll_cols].reset_index(),
        stragglers=_stragglers(m, colls.reset_index()),
    )


def rank_collectives(collectives: pd.DataFrame, rank: int, regime: str) -> pd.DataFrame:
    """One rank's ``ParsedTrace.collectives`` with its rank and matching group added."""
    return collectives.assign(rank=rank, group=collective_groups(collectives, regime))
