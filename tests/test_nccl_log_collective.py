"""The collective of a log whose header does not name it: read from its table (busbw / algbw at
the run's world size, the root and redop columns), and a log refused where its table does not fit
the collective a fit asks for.

The expected collectives are the ones the logs' own headers name (``# Collective test starting:
X_perf``), or for the logs printed without that line, the test their source ran (their file
names, tests/data/nccl_tests/SOURCES.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from commprof.cli import main
from commprof.modeling.collective.calibration import calibrate
from commprof.modeling.collective.clusters import load_cluster
from commprof.modeling.collective.nccl_log import parse_text, read_log, read_logs
from commprof.modeling.collective.nccl_log_collective import (
    log_world_size,
    placement_summary,
    skipped_summary,
)

DATA = Path(__file__).parent / "data" / "nccl_tests"
NAMING = re.compile(r"Collective test (?:starting|concluded)")
RANK = re.compile(r"#\s+Rank\s+\d+")
AMBIGUOUS = {
    frozenset({"all_gather", "alltoall"}),  # (n-1)/n, both print redop 'none' and root -1
    frozenset({"all_reduce", "sendrecv"}),  # at 2 ranks 2(n-1)/n is 1, and both print a redop
}
"""What a table cannot tell apart: there the reader names no collective but keeps both."""


def _without(text: str, *patterns: re.Pattern[str]) -> str:
    return "\n".join(
        line for line in text.splitlines() if not any(p.search(line) for p in patterns)
    )


def _named_runs() -> list[tuple[str, int, str]]:
    """(file, run, collective) of every run of the corpus whose header names its test."""
    out = []
    for path in sorted(DATA.rglob("*.txt")):
        for run in read_log(path).runs:
            if run.collective is not None and not run.inferred:
                out.append((str(path.relative_to(DATA)), run.index, run.collective))
    return out


def test_the_table_alone_gives_the_collective_its_header_names() -> None:
    # every run of the corpus whose header names its test, read again with the naming lines cut:
    # the table gives the same collective, or (only where the table cannot tell) none, keeping
    # the named one among its candidates
    named = _named_runs()
    agree, ambiguous = 0, []
    for name, index, truth in named:
        bare = parse_text(_without((DATA / name).read_text(), NAMING), name).runs[index - 1]
        assert truth in bare.candidates, (name, index, bare.evidence)
        if bare.collective == truth:
            assert bare.inferred and bare.describe().count("(inferred from the table)") == 1
            agree += 1
        else:
            assert bare.collective is None, (name, index, bare.collective)
            assert frozenset(bare.candidates) in AMBIGUOUS, (name, index, bare.candidates)
            ambiguous.append(truth)
    # 51 named runs: 30 named the same; 20 all_gather / alltoall runs and one two-rank
    # all-reduce (gh200-alps, one GPU a node) left open
    assert (agree, len(named)) == (30, 51)
    assert sorted(set(ambiguous)) == ["all_gather", "all_reduce", "alltoall"]
    assert ambiguous.count("all_reduce") == 1


def test_logs_printed_without_the_naming_line_are_named_by_their_table() -> None:
    # the logs whose source printed no naming line: all-reduce and broadcast named (ABCI's old
    # layout: broadcast prints a root and no redop), alltoall and all_gather left open between
    # the two, and a two-rank all-reduce (GKE's MPIJob, one GPU a node) between it and sendrecv
    seen = {}
    for path in sorted(DATA.rglob("*.txt")):
        log = read_log(path)
        if len(log.runs) != 1 or (not log.run.inferred and log.run.collective is not None):
            continue
        test = path.name.split("_p")[0]
        run = log.run
        assert test in run.candidates, (path, run.evidence)
        open_pair = frozenset(run.candidates) in AMBIGUOUS
        assert run.collective == (None if open_pair else test), (path, run.candidates)
        assert open_pair == (test in ("alltoall", "all_gather") or run.world_size == 2), path
        seen[test] = seen.get(test, 0) + 1
    assert seen == {"all_reduce": 25, "broadcast": 12, "alltoall": 6, "all_gather": 5}


def test_without_rank_lines_the_table_never_contradicts_its_header() -> None:
    # the header's naming lines and every rank line cut: the world size comes from busbw / algbw
    # where it can, else any whole number, so fewer are named, but none is ruled out wrongly
    for name, index, truth in _named_runs():
        bare = parse_text(_without((DATA / name).read_text(), NAMING, RANK), name)
        run = bare.runs[index - 1]
        assert truth in run.candidates and run.collective in (truth, None), (name, run.evidence)


def test_the_abci_broadcast_log_fitted_as_all_reduce_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = DATA / "abci-a100/broadcast_p8.txt"
    argv = ["collective", "--cluster", "abci-a100", "--world-size", "16", "--fit", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"error: {path}: is a log of broadcast, not all_reduce (its header names no collective; "
        "its table: busbw/algbw 1.000 at 8 ranks, no redop column, root 0); give --collective "
        "broadcast"
    )
    assert main([*argv, "--collective", "broadcast", "--json"]) == 0
    assert "broadcast inferred from the table" in capsys.readouterr().err
    # estimate --nccl-tests calibrates all-reduce only: the fix it names is another log
    estimate = ["estimate", "--model", "srn-1m", "--world-size", "16", "--cluster", "abci-a100"]
    assert main([*estimate, "--nccl-tests", str(path)]) == 2
    assert (
        "not all_reduce" in (err := capsys.readouterr().err) and "give a log of all_reduce" in err
    )
    # the same log with its rank lines cut: broadcast, gather or scatter, never all_reduce
    log = parse_text(_without(path.read_text(), RANK), "bare.txt")
    assert log.collective is None and log.run.candidates == ("broadcast", "gather", "scatter")
    with pytest.raises(
        ValueError,
        match=r"^bare\.txt: fits broadcast or gather or scatter, not all_reduce \(.*busbw/algbw "
        r"1\.000 \(ranks not known\), no redop column, root 0\); give --collective broadcast if "
        r"it is a log of broadcast, else a log of all_reduce$",
    ):
        calibrate(load_cluster("abci-a100"), [log])


def test_an_alltoall_log_without_its_naming_line_is_not_an_all_reduce() -> None:
    # OCI's GB200 page printed no naming line: the table fits all_gather or alltoall, so a fit
    # of all_gather may take it (the table cannot tell), and one of all_reduce may not
    log = read_log(DATA / "oci-gb200/alltoall_p8.txt")
    assert log.collective is None and log.run.candidates == ("all_gather", "alltoall")
    assert "(the table fits all_gather or alltoall)" in log.run.describe()
    with pytest.raises(ValueError, match=r"alltoall_p8\.txt: fits all_gather or alltoall, not "):
        calibrate(load_cluster("dgx-h100"), [log])


def test_a_log_without_header_and_an_all_reduce_ratio_is_inferred_all_reduce() -> None:
    # gh200-alps's log cut to its table's column header and rows: no naming line, no rank line,
    # no footer. busbw / algbw = 1.75 = 2(n-1)/n gives 8 ranks, and only all_reduce has it
    text = (DATA / "gh200-alps/all_reduce_p8.txt").read_text().splitlines()
    header = next(i for i, line in enumerate(text) if re.match(r"^\s*#\s+size\s+count", line))
    rows = [line for line in text[header + 1 :] if re.match(r"^\s+\d", line)]
    run = parse_text("\n".join([text[header], *rows]), "table.txt").run
    assert (run.collective, run.inferred, run.world_size) == ("all_reduce", True, None)
    assert run.evidence == "busbw/algbw 1.750 at 8 ranks (implied), redop sum, root -1"
    assert skipped_summary(parse_text("\n".join([text[header], *rows]), "table.txt")) == (
        f"table.txt: run 1 skipped nothing; no footer; all_reduce inferred from the table "
        f"({run.evidence})"
    )


def _formula_lines(factor: float, redop: str, root: int) -> list[str]:
    """A table printed as nccl-tests prints it for 6 ranks (rank lines listed): algbw = size /
    time, busbw = algbw x the test's factor, both to 0.01 GB/s."""
    ranks = [
        f"#  Rank {r} Group  0 Pid {100 + r} on node0 device  {r} [0x0f] GPU" for r in range(6)
    ]
    head = (
        "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong"
    )
    lines = [*ranks, head]
    for k in range(20, 31):
        size, time_us = 1 << k, 50.0 + (1 << k) / 150_000
        algbw = size / time_us / 1e3
        lines.append(
            f"{size} {size // 4} float {redop} {root} {time_us:.1f} {algbw:.2f} "
            f"{algbw * factor:.2f} 0 {time_us:.1f} {algbw:.2f} {algbw * factor:.2f} 0"
        )
    return lines


@pytest.mark.parametrize(
    ("factor", "redop", "root", "named"),
    [
        (2 * 5 / 6, "sum", -1, "all_reduce"),
        (5 / 6, "sum", -1, "reduce_scatter"),
        (5 / 6, "none", -1, None),  # all_gather or alltoall
        (1.0, "none", 0, "broadcast"),
        (1.0, "sum", 0, "reduce"),
        (1.0, "sum", -1, "sendrecv"),
    ],
)
def test_each_signature_in_closed_form(factor: float, redop: str, root: int, named: str) -> None:
    run = parse_text("\n".join(_formula_lines(factor, redop, root)), "formula.txt").run
    assert run.collective == named and run.inferred == (named is not None)
    assert run.evidence == (f"busbw/algbw {factor:.3f} at 6 ranks, redop {redop}, root {root}")


def test_a_table_that_contradicts_its_header_is_said_aloud() -> None:
    # the header names all_reduce; the table's busbw / algbw is (n-1)/n at its 6 listed ranks
    # with a reduction: reduce_scatter's signature (or a world size other than the one listed).
    # The header is taken, and the summary says what the table shows.
    text = "\n".join(
        ["# Collective test starting: all_reduce_perf", *_formula_lines(5 / 6, "sum", -1)]
    )
    log = parse_text(text, "contra.txt")
    assert (log.run.collective, log.run.inferred, log.run.candidates) == (
        "all_reduce",
        False,
        ("reduce_scatter",),
    )
    assert skipped_summary(log) == (
        "contra.txt: run 1 skipped nothing; no footer; its header names all_reduce, but its "
        "table fits reduce_scatter (busbw/algbw 0.833 at 6 ranks, redop sum, root -1): is that "
        "the world size it ran at?"
    )
    agreeing = "\n".join(
        ["# Collective test starting: all_reduce_perf", *_formula_lines(5 / 3, "sum", -1)]
    )
    assert "header names" not in (skipped_summary(parse_text(agreeing, "ok.txt")) or "")


def test_a_log_without_rank_lines_takes_the_world_size_its_table_implies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # aws-p5's published log cut its rank lines: busbw / algbw = 1.875 gives 16 ranks, which
    # --fit takes (the summary says it was implied) and a predicted 16 is that log's own times.
    # A table of ratio 1 (broadcast) implies none: refused, naming the file and the fix.
    path = DATA / "aws-p5/all_reduce_p16.txt"
    log = read_log(path)
    assert (log.world_size, log_world_size(log), log_world_size(log, 16)) == (None, 16, 16)
    argv = ["collective", "--cluster", "aws-p5", "--world-size", "16", "--fit", str(path)]
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    assert "16 ranks (implied)" in err
    rows = {r["bytes"]: r for r in json.loads(out)}
    measured = {r.num_bytes: r.time_us for r in log.rows}
    assert rows and set(rows) <= set(measured) and all(r["follows_log"] for r in rows.values())
    assert all(r["time_us"] == pytest.approx(measured[s]) for s, r in rows.items())
    lines = _formula_lines(1.0, "none", 0)
    bare = parse_text("\n".join(line for line in lines if not RANK.search(line)), "bcast.txt")
    with pytest.raises(ValueError, match=r"bcast.txt: lists no '#  Rank' lines, and its busbw"):
        log_world_size(bare)


def test_a_file_of_several_collectives_gives_the_one_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # h100-cluster01 printed five tests into one file: --collective all_gather fits its
    # all_gather run, with or without --run all, and says which runs were set aside; --run K
    # still means run K of the file; a collective the file does not hold is refused.
    path = DATA / "h100-cluster01/five_collectives_p8_n1.txt"
    for run in (None, "all"):
        (log,) = read_logs([path], run, "all_gather")
        assert (log.run.index, log.collective) == (2, "all_gather")
        assert [r.index for r in log.set_aside] == [1, 3, 4, 5]
        assert skipped_summary(log) == (
            f"{path}: run(s) 1 (all_reduce), 3 (reduce_scatter), 4 (alltoall), 5 (sendrecv) "
            "set aside: another collective"
        )
    assert read_logs([path], "3", "all_gather")[0].run.collective == "reduce_scatter"
    with pytest.raises(ValueError, match=r"holds 5 runs .*pick one with --run K"):
        read_logs([path])
    argv = ["collective", "--cluster", "dgx-h100", "--world-size", "8", "--fit", str(path)]
    assert main([*argv, "--collective", "all_gather", "--min-bytes", "33554432", "--json"]) == 0
    out, err = capsys.readouterr()
    measured = {r.num_bytes: r.time_us for r in read_log(path).runs[1].rows}
    rows = json.loads(out)
    assert rows and all(r["follows_log"] for r in rows) and "set aside" in err
    assert all(r["time_us"] == pytest.approx(measured[r["bytes"]]) for r in rows)
    one = DATA / "h100-cluster01/alltoall_sendrecv_p16_n2.txt"
    with pytest.raises(ValueError, match=r"alltoall_sendrecv_p16_n2\.txt: is a log of alltoall"):
        calibrate(load_cluster("dgx-h100"), read_logs([one], "all", "all_gather"), "all_gather")


def test_hosts_other_than_the_whole_nodes_fitted_are_said_aloud(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # one GPU a node on two nodes: fitted as two GPUs of one node of 8 (or 4), said aloud; two
    # whole nodes of 8, and a log without rank lines, say nothing
    one_a_node = DATA / "gke-h200/all_reduce_p2_mpijob.txt"
    said = placement_summary(read_log(one_a_node), 8)
    assert said == (
        f"{one_a_node}: its 2 ranks are on 2 hosts (its rank lines), but whole nodes of 8 GPUs "
        "hold them on 1, as the fit takes them: if its hosts are nodes, give a description of "
        "their GPUs a node"
    )
    assert placement_summary(read_log(DATA / "gh200-alps/all_reduce_p2_one_gpu_per_node.txt"), 4)
    assert placement_summary(read_log(DATA / "gke-b200/all_gather_p16.txt"), 8) is None
    assert placement_summary(read_log(DATA / "aws-p5/all_reduce_p16.txt"), 8) is None
    argv = ["collective", "--cluster", "dgx-h100", "--world-size", "16", "--fit", str(one_a_node)]
    assert main(argv) == 0
    assert said in capsys.readouterr().err
