"""Every public nccl-tests log kept in tests/data/nccl_tests, read as its source printed it, and
variants of a real log as clusters print it (launcher prefixes, NCCL lines, two runs, 0-byte and
wrong rows), each built from the real text by a transform.

The expected values were read off each file by eye (its rank lines, its first and last rows);
logs without a licence (tests/data/nccl_tests/SOURCES.md) are not read by any test.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from commprof.cli import main
from commprof.commands.collective import add_arguments as add_collective_arguments
from commprof.commands.estimate import add_arguments as add_estimate_arguments
from commprof.modeling.collective import nccl_log
from commprof.modeling.collective.cluster_link import cluster_link
from commprof.modeling.collective.nccl_log import parse_text, read_log, read_logs
from commprof.modeling.collective.nccl_log_collective import implied_world_size, skipped_summary
from commprof.modeling.collective.nccl_log_runs import Row

DATA = Path(__file__).parent / "data" / "nccl_tests"

# file: (ranks, rows kept, rows skipped, footer printed, first size kept, last size, its time us)
CORPUS = {
    "abci-a100/all_reduce_p4.txt": (4, 24, 0, True, 4, 33554432, 298.4),
    "abci-a100/all_reduce_p8.txt": (8, 24, 0, True, 4, 33554432, 370.7),
    "abci-a100/all_reduce_p16.txt": (16, 24, 0, True, 4, 33554432, 1887.3),
    "abci-a100/all_reduce_p32.txt": (32, 24, 0, True, 4, 33554432, 2075.4),
    "abci-a100/all_reduce_p64.txt": (64, 24, 0, True, 4, 33554432, 4342.8),
    "abci-a100/all_reduce_p128.txt": (128, 24, 0, True, 4, 33554432, 2500.7),
    "abci-a100/broadcast_p4.txt": (4, 24, 0, True, 4, 33554432, 191.2),
    "abci-a100/broadcast_p8.txt": (8, 24, 0, True, 4, 33554432, 217.0),
    "abci-a100/broadcast_p16.txt": (16, 24, 0, True, 4, 33554432, 1251.3),
    "abci-a100/broadcast_p32.txt": (32, 24, 0, True, 4, 33554432, 1520.6),
    "abci-a100/broadcast_p64.txt": (64, 24, 0, True, 4, 33554432, 3389.5),
    "abci-a100/broadcast_p128.txt": (128, 24, 0, True, 4, 33554432, 2840.0),
    "abci-v100/all_reduce_p4.txt": (4, 24, 0, True, 4, 33554432, 447.3),
    "abci-v100/all_reduce_p8.txt": (8, 24, 0, True, 4, 33554432, 2970.9),
    "abci-v100/all_reduce_p16.txt": (16, 24, 0, True, 4, 33554432, 3156.6),
    "abci-v100/all_reduce_p32.txt": (32, 24, 0, True, 4, 33554432, 3319.4),
    "abci-v100/all_reduce_p64.txt": (64, 24, 0, True, 4, 33554432, 3857.6),
    "abci-v100/all_reduce_p128.txt": (128, 24, 0, True, 4, 33554432, 5031.7),  # UCX warnings
    "abci-v100/broadcast_p4.txt": (4, 24, 0, True, 4, 33554432, 332.0),
    "abci-v100/broadcast_p8.txt": (8, 24, 0, True, 4, 33554432, 1850.5),
    "abci-v100/broadcast_p16.txt": (16, 24, 0, True, 4, 33554432, 17065.0),  # an integer time
    "abci-v100/broadcast_p32.txt": (32, 24, 0, True, 4, 33554432, 3208.8),
    "abci-v100/broadcast_p64.txt": (64, 24, 0, True, 4, 33554432, 4764.9),
    "abci-v100/broadcast_p128.txt": (128, 24, 0, True, 4, 33554432, 7590.5),
    "aws-p4de/all_reduce_p16_srun.txt": (None, 29, 0, False, 8, 2147483648, 51406.0),
    "aws-p5/all_reduce_p16.txt": (None, 32, 0, True, 8, 17179869184, 66988.0),
    "aws-p5/all_reduce_p16_srun.txt": (None, 32, 0, False, 8, 17179869184, 66132.0),
    "aws-p5/all_reduce_p16_mpijob_excerpt.txt": (None, 6, 1, True, 67108864, 2147483648, 9197.5),
    "aws-p5/all_reduce_p8_batch.txt": (None, 32, 0, True, 8, 17179869184, 62239.0),
    "aws-p5en/all_reduce_p128_excerpt.txt": (None, 3, 0, True, 8, 17179869184, 92173.0),
    "dgx-h100/all_reduce_p8_dgxc.txt": (8, 32, 0, True, 8, 17179869184, 62648.0),
    "gh200-alps/all_reduce_p2_one_gpu_per_node.txt": (2, 8, 0, True, 1048576, 134217728, 5871.07),
    "gh200-alps/all_reduce_p8.txt": (8, 25, 0, True, 8, 134217728, 1916.4),
    "gh200-alps/all_reduce_p8_cxi_hook_disabled.txt": (8, 25, 0, True, 8, 134217728, 43293.0),
    "gh200-olivia/all_reduce_p8_int8.txt": (8, 28, 0, True, 1, 134217728, 2309.49),
    "gh200-olivia/all_reduce_p16_int8_wrong.txt": (16, 22, 6, False, 1, 134217728, 2800.93),
    "oci-bm-gpu4.8/all_reduce_p16_oke.txt": (16, 31, 0, True, 8, 8589934592, 67689.0),
    # OCI's quick-start pages: excerpts of two rows; GB300's rank lines cut with '...' (the last
    # rank listed is the world's last), world sizes without rank lines from the page's headings
    "oci-b300/all_reduce_p16.txt": (None, 2, 0, True, 8589934592, 17179869184, 42007.0),
    "oci-b300/all_reduce_p8.txt": (None, 1, 0, True, 8589934592, 8589934592, 18006.0),
    "oci-b300/alltoall_p16.txt": (None, 1, 0, True, 8589934592, 8589934592, 44498.0),
    "oci-b300/alltoall_p8.txt": (None, 1, 0, True, 8589934592, 8589934592, 11126.0),
    "oci-gb200/all_reduce_p128.txt": (None, 2, 0, False, 4294967296, 8589934592, 21313.0),
    "oci-gb200/all_reduce_p192.txt": (None, 2, 0, False, 4294967296, 8589934592, 22820.0),
    "oci-gb200/all_reduce_p4.txt": (4, 2, 0, False, 4294967296, 8589934592, 19424.0),
    "oci-gb200/all_reduce_p64.txt": (None, 2, 0, False, 4294967296, 8589934592, 18967.0),
    "oci-gb200/alltoall_p128.txt": (None, 2, 0, True, 4294967296, 8589934592, 95018.0),
    "oci-gb200/alltoall_p192.txt": (None, 2, 0, True, 4294967296, 8589934592, 136749.0),
    "oci-gb200/alltoall_p4.txt": (None, 2, 0, True, 4294967296, 8589934592, 10470.0),
    "oci-gb200/alltoall_p64.txt": (None, 2, 0, True, 4294967296, 8589934592, 13574.0),
    "oci-gb200/alltoall_p8.txt": (None, 2, 0, True, 8589934592, 17179869184, 22698.0),
    "oci-gb300/all_reduce_p128.txt": (128, 2, 0, True, 8589934592, 17179869184, 46170.0),
    "oci-gb300/all_reduce_p4.txt": (4, 2, 0, True, 8589934592, 17179869184, 37610.0),
    "oci-gb300/all_reduce_p64.txt": (64, 2, 0, True, 8589934592, 17179869184, 36350.0),
    "oci-gb300/all_reduce_p8.txt": (8, 2, 0, True, 8589934592, 17179869184, 35722.0),
    "oci-gb300/alltoall_p128.txt": (128, 2, 0, True, 8589934592, 17179869184, 357610.0),
    "oci-gb300/alltoall_p4.txt": (4, 2, 0, True, 8589934592, 17179869184, 20527.0),
    "oci-gb300/alltoall_p64.txt": (64, 2, 0, True, 8589934592, 17179869184, 25357.0),
    "oci-gb300/alltoall_p8.txt": (8, 2, 0, True, 8589934592, 17179869184, 21943.0),
    "oci-mi355x-pollara/all_reduce_p16.txt": (None, 2, 0, True, 8589934592, 17179869184, 86980.0),
    "oci-mi355x-pollara/all_reduce_p32.txt": (None, 2, 0, True, 8589934592, 17179869184, 89839.0),
    "oci-mi355x-pollara/all_reduce_p8.txt": (None, 2, 0, True, 8589934592, 17179869184, 73544.0),
    "oci-mi355x-pollara/alltoall_p16.txt": (None, 2, 0, True, 8589934592, 17179869184, 185711.0),
    "oci-mi355x-pollara/alltoall_p32.txt": (None, 2, 0, True, 8589934592, 17179869184, 328749.0),
    "oci-mi355x-pollara/alltoall_p8.txt": (None, 2, 0, True, 8589934592, 17179869184, 41626.0),
    "oci-mi355x/all_reduce_p8.txt": (8, 2, 0, True, 8589934592, 17179869184, 73913.0),
    "oci-mi355x/alltoall_p8.txt": (8, 2, 0, True, 8589934592, 17179869184, 41593.0),
    # GKE (kubernetes-sigs/dranet, SkyPilot): the launcher's lines first (SSH warnings, a
    # hostfile's names and IP addresses, an MPIJob launcher's 'set -x' line and Open MPI help
    # banners); the SkyPilot run under '(head, rank=0, pid=3808) [1,0]<stdout>:' on every line
    "gke-b200/all_gather_p16.txt": (16, 24, 0, True, 1024, 8589934592, 30970.0),
    "gke-b200/all_gather_p2_excerpt.txt": (2, 8, 0, False, 67108864, 8589934592, 8897.6),
    "gke-b200/all_gather_p2_one_gpu_per_node.txt": (2, 26, 2, True, 32, 1073741824, 14640.0),
    "gke-h200/all_gather_p16_skypilot.txt": (16, 24, 0, True, 1024, 8589934592, 24724.0),
    "gke-h200/all_gather_p2_one_gpu_per_node.txt": (2, 24, 0, True, 1024, 8589934592, 133370.0),
    "gke-h200/all_reduce_p2_mpijob.txt": (2, 24, 0, True, 1024, 8589934592, 269368.0),
}

# logs a page printed without a table, kept as *.refused: file: (line, what the reader says)
REFUSED = {
    # a run that printed its header and stopped (no NIC reached the pods): no rows
    "gke-b200/all_gather_p4_no_rows.refused": (18, "the table has a header but no rows"),
    # the page cut the table out ('# ... (truncated NCCL output for brevity) ...')
    "gke-b200/all_gather_p16_4w_truncated.refused": (
        33,
        "a '# Avg bus bandwidth' footer with no table above it",
    ),
}


# files of several runs (one a collective): file: ranks, then per run (collective, rows, first
# size, last size, its time us), read off the '# Collective test starting' lines and the tables
H100 = "h100-cluster01/five_collectives_p{}.txt"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")
MULTI = {
    H100.format("8_n1"): (8, [33554432] * 5, [17179869184] * 5,
                          [62340.7, 41542.0, 41211.4, 43193.3, 46779.2]),
    H100.format("10_n10"): (10, [33554432] + [33554400] * 3 + [33554432],
                            [17179869184] + [17179869120] * 3 + [17179869184],
                            [632480.0, 321112.0, 316586.0, 346210.0, 691104.0]),
    H100.format("20_n10"): (20, [33554432] + [33554240] * 3 + [33554432],
                            [17179869184] + [17179869120] * 3 + [17179869184],
                            [333590.0, 167723.0, 166835.0, 341262.0, 681954.0]),
    H100.format("40_n10"): (40, [33554432] + [33553920] * 3 + [33554432],
                            [17179869184] + [17179868800] * 3 + [17179869184],
                            [170665.0, 86184.2, 85733.1, 338186.0, 655122.0]),
    H100.format("80_n10"): (80, [33554432] + [33553920] * 3 + [33554432],
                            [17179869184] + [17179868160] * 3 + [17179869184],
                            [105854.0, 52314.1, 52458.7, 336737.0, 1128428.0]),
}  # fmt: skip


def test_the_corpus_lists_every_kept_log() -> None:
    kept = {str(p.relative_to(DATA)) for p in DATA.rglob("*.txt")}
    pairs = "h100-cluster01/alltoall_sendrecv_p16_n2.txt"
    assert kept == set(CORPUS) | set(MULTI) | {pairs}
    assert len(kept) == 78 and len({name.split("/")[0] for name in kept}) == 17
    assert {str(p.relative_to(DATA)) for p in DATA.rglob("*.refused")} == set(REFUSED)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_log_a_page_printed_without_its_table_is_refused_with_file_and_line(name: str) -> None:
    line, said = REFUSED[name]
    with pytest.raises(ValueError, match=rf"{re.escape(name)}:{line}: {re.escape(said)}"):
        read_log(DATA / name)


@pytest.mark.parametrize("name", sorted(MULTI))
def test_files_of_several_runs_read_each_run(name: str) -> None:
    ranks, firsts, lasts, last_times_us = MULTI[name]
    log = read_log(DATA / name)
    assert [r.collective for r in log.runs] == list(COLLECTIVES)
    assert all(r.world_size == ranks and r.complete and len(r.rows) == 10 for r in log.runs)
    assert [r.rows[0].num_bytes for r in log.runs] == firsts
    assert [r.rows[-1].num_bytes for r in log.runs] == lasts
    assert [r.rows[-1].time_us for r in log.runs] == last_times_us
    with pytest.raises(
        ValueError, match=rf"holds 5 runs \(run 1 \(line \d+\): all_reduce, {ranks} "
    ):
        log.rows  # noqa: B018 -- a file of several runs must be narrowed first
    assert log.select(3).collective == "reduce_scatter"
    pairs = read_log(DATA / "h100-cluster01/alltoall_sendrecv_p16_n2.txt")
    assert [(r.collective, r.world_size, len(r.rows)) for r in pairs.runs] == [
        ("alltoall", 16, 3),
        ("sendrecv", 16, 3),
    ]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_public_log_reads_as_its_source_printed_it(name: str) -> None:
    ranks, kept, skipped, complete, first, last, last_time_us = CORPUS[name]
    log = read_log(DATA / name)
    (run,) = log.runs
    assert (run.world_size, len(run.rows), len(run.skipped), run.complete) == (
        ranks,
        kept,
        skipped,
        complete,
    )
    assert (run.rows[0].num_bytes, run.rows[-1].num_bytes) == (first, last)
    assert run.rows[-1].time_us == last_time_us
    sizes = [r.num_bytes for r in run.rows]
    assert sizes == sorted(sizes) and all(r.time_us > 0 for r in run.rows)


def test_wrong_rows_are_counted_aloud_and_never_kept() -> None:
    log = read_log(DATA / "gh200-olivia/all_reduce_p16_int8_wrong.txt")
    wrong = [s for s in log.run.skipped if s.kind == "#wrong"]
    # 2 MiB .. 64 MiB printed non-zero #wrong counts (18134 ... 113492): six sizes
    assert [int(s.text.split()[0]) for s in wrong] == [2 << 20 << i for i in range(6)]
    assert not {r.num_bytes for r in log.rows} & {int(s.text.split()[0]) for s in wrong}
    said = skipped_summary(log)
    assert said is not None and "6 #wrong" in said and "no footer" in said


# ---- variants of a real log, each built by a transform of its text -------------------------

OCI = (DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt").read_text()
BASE = read_log(DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt").run
INFO = "inst-abc:12345:12400 [3] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15"


def _values(rows: tuple[Row, ...]) -> list[tuple[object, ...]]:
    """Rows without their line numbers (a transform that adds lines moves them)."""
    return [
        (r.num_bytes, r.dtype, r.redop, r.time_us, r.busbw_gbps, r.inplace_time_us) for r in rows
    ]


def _prefix(text: str, label: str) -> str:
    return "\n".join(label + line for line in text.splitlines()) + "\n"


@pytest.mark.parametrize(
    "label",
    [
        "0: ",  # srun -l, one task
        " 0: ",  # srun -l padded where there are 10 or more tasks
        "[1,0]<stdout>:",  # Open MPI --tag-output
        "[pod/nccl-test-launcher-7x2kq/mpi-launcher] ",  # kubectl logs --prefix
        "2026-12-07T08:01:02.123456789Z [1,0]<stdout>:",  # kubectl --timestamps over mpirun
        "(head, rank=0, pid=3808) [1,0]<stdout>:",  # SkyPilot over mpirun
        "(RayTrainWorker pid=2345, ip=10.0.0.5) ",  # Ray
    ],
)
def test_launcher_prefixes_change_nothing(label: str) -> None:
    run = parse_text(_prefix(OCI, label), "prefixed.txt").run
    assert run.rows == BASE.rows and run.world_size == 16 and run.complete


def test_launcher_lines_that_start_with_a_digit_outside_the_table_are_passed_over() -> None:
    """A hostfile's IP addresses before the header (GKE's run_nccl_tests.sh prints them) and a
    count after the footer are the launcher's; a row before any header is still refused."""
    lines = OCI.splitlines()
    first_row = next(i for i, line in enumerate(lines) if re.match(r"^\s+8\s+2\s+float", line))
    chatter = ["Generating hostfiles for 2 hosts:", "10.68.3.42", "10.68.5.39"]
    run = parse_text("\n".join([*chatter, *lines, "2 hosts done"]), "hosts.txt").run
    assert _values(run.rows) == _values(BASE.rows) and not run.skipped and run.complete
    with pytest.raises(ValueError, match=r"cut\.txt:4: a table row before any header"):
        parse_text("\n".join([*chatter, *lines[first_row:]]), "cut.txt")


def test_a_log_whose_page_dropped_every_hash_reads_the_same() -> None:
    """A log pasted outside a code block loses each line's '#' (Markdown took it for a heading):
    the header, rank lines and footer are still known by their words."""
    bare = "\n".join(line.replace("#", "", 1) for line in OCI.splitlines())
    assert not any(line.lstrip().startswith("#") for line in bare.splitlines())
    run = parse_text(bare, "bare.txt").run
    assert run.rows == BASE.rows and run.world_size == 16 and run.complete
    lines = bare.splitlines()
    first_row = next(i for i, line in enumerate(lines) if re.match(r"^\s+8\s+2\s+float", line))
    with pytest.raises(ValueError, match=r"bare\.txt:1: a table row before any header"):
        parse_text("\n".join(lines[first_row:]), "bare.txt")  # still strict about a cut top


def test_nccl_lines_between_rows_and_inside_one() -> None:
    lines = OCI.splitlines()
    first_row = next(i for i, line in enumerate(lines) if re.match(r"^\s+8\s+2\s+float", line))
    between = [*lines[: first_row + 3], INFO, f"10-0-0-1:9:9 [0] NCCL WARN {INFO}"]
    between += lines[first_row + 3 :]
    run = parse_text("\n".join(between), "between.txt").run
    assert _values(run.rows) == _values(BASE.rows) and not run.skipped
    # a row cut by a log line: its head and the log line, the log line, then its remainder
    row = lines[first_row + 20]
    cut = row.index("float") + 30
    broken = [*lines[: first_row + 20], row[:cut] + INFO, INFO, row[cut:]]
    broken += lines[first_row + 21 :]
    run = parse_text("\n".join(broken), "broken.txt").run
    assert len(run.rows) == len(BASE.rows) - 1
    assert [(s.line, s.kind) for s in run.skipped] == [
        (first_row + 21, "broken"),
        (first_row + 23, "broken"),
    ]
    said = skipped_summary(parse_text("\n".join(broken), "broken.txt"))
    assert said == (
        f"broken.txt: run 1 skipped 2 broken (lines {first_row + 21}, {first_row + 23}); "
        "all_reduce inferred from the table (busbw/algbw 1.875 at 16 ranks, redop sum, root -1)"
    )  # OCI's page printed no '# Collective test starting' line: the table names the test


def test_a_header_without_a_column_a_row_is_read_by_is_refused_with_file_and_line() -> None:
    # found by the fuzz: a header whose 'type' became '#type' (an edit) named no 'type' column
    lines = OCI.splitlines()
    at = next(i for i, line in enumerate(lines) if re.match(r"^#\s+size\s+count", line))
    lines[at] = lines[at].replace(" type", "#type", 1)
    with pytest.raises(ValueError, match=rf"^edited\.txt:{at + 1}: the table's header names no"):
        parse_text("\n".join(lines), "edited.txt")


def test_a_cut_row_without_a_log_line_is_refused_with_file_and_line() -> None:
    lines = OCI.splitlines()
    first_row = next(i for i, line in enumerate(lines) if re.match(r"^\s+8\s+2\s+float", line))
    lines[first_row + 4] = lines[first_row + 4][:50]
    with pytest.raises(
        ValueError, match=rf"^cut\.txt:{first_row + 5}: 4 fields where the header \(line 25"
    ):
        parse_text("\n".join(lines), "cut.txt")


def test_two_runs_in_one_file_are_listed_and_chosen(tmp_path: Path) -> None:
    second = OCI.replace("-1    ", "-1    1", 1)  # the same run, one time changed
    path = tmp_path / "two.txt"
    path.write_text(OCI + "\n" + second)
    log = read_log(path)
    assert [r.index for r in log.runs] == [1, 2] and log.runs[0].rows == BASE.rows
    assert log.runs[1].world_size == 16 and log.runs[1].header_line > log.runs[0].rows[-1].line
    with pytest.raises(ValueError, match=r"holds 2 runs \(run 1 \(line 25\): .*; pick one"):
        read_logs([path])
    assert read_logs([path], "2")[0].run == log.runs[1]
    assert [one.run for one in read_logs([path], "all")] == list(log.runs)
    with pytest.raises(ValueError, match="--run 3: the file holds 2 run"):
        read_logs([path], "3")
    with pytest.raises(ValueError, match="given twice"):
        read_logs([path, path], "all")


def test_zero_byte_rows_na_wrong_and_an_error_column() -> None:
    lines = OCI.splitlines()
    first_row = next(i for i, line in enumerate(lines) if re.match(r"^\s+8\s+2\s+float", line))
    zero = "           0             0     float     sum      -1    15.51    0.00    0.00      0    15.52    0.00    0.00      0"  # noqa: E501
    na = [re.sub(r"(\s)0$", r"\1N/A", line) for line in lines]
    with_zero = [*na[:first_row], zero, zero, *na[first_row:]]
    run = parse_text("\n".join(with_zero), "zero.txt").run
    assert _values(run.rows) == _values(BASE.rows)
    assert [r.line for r in run.rows] == [r.line + 2 for r in BASE.rows]
    assert [s.kind for s in run.skipped] == ["0 bytes", "0 bytes"]
    wrong = list(lines)
    wrong[first_row + 25] = re.sub(r"0$", "12", wrong[first_row + 25])
    run = parse_text("\n".join(wrong), "wrong.txt").run
    assert [(s.line, s.kind) for s in run.skipped] == [(first_row + 26, "#wrong")]
    bad = list(lines)
    bad[first_row + 25] = re.sub(r"0$", "x", bad[first_row + 25])
    with pytest.raises(ValueError, match=rf"bad\.txt:{first_row + 26}: #wrong 'x' is not a count"):
        parse_text("\n".join(bad), "bad.txt")
    # the old layout: no root, an error magnitude; one marked '*' exceeded the threshold
    old = (DATA / "abci-v100/broadcast_p16.txt").read_text().replace("0e+00\n", "3e-02*\n", 1)
    run = parse_text(old, "old.txt").run
    marked = 1 + old.splitlines().index(next(x for x in old.splitlines() if x.endswith("*")))
    assert len(run.rows) == 23 and [(s.line, s.kind) for s in run.skipped] == [(marked, "#wrong")]


def test_a_log_over_the_size_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.txt"
    path.write_text(OCI)
    monkeypatch.setattr(nccl_log, "MAX_LOG_BYTES", 1000)
    with pytest.raises(ValueError, match="larger than 1,000 bytes"):
        read_log(path)


# ---- repeated flags keep every log ---------------------------------------------------------


def _slower_copy(tmp_path: Path) -> Path:
    """The OCI log with every out-of-place time doubled: a second, different log."""
    lines = []
    for line in OCI.splitlines():
        f = line.split()
        if len(f) == 13 and f[0].isdigit():
            line = line.replace(f" {f[5]} ", f" {float(f[5]) * 2:.1f} ", 1)
        lines.append(line)
    path = tmp_path / "slower.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_repeated_fit_flag_keeps_every_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    oci, slower = str(DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt"), str(_slower_copy(tmp_path))
    base = ["collective", "--cluster", "oci-bm-gpu4.8", "--world-size", "32", "--json"]

    def table(*fit: str) -> list[dict[str, object]]:
        assert main([*base, *fit]) == 0
        return json.loads(capsys.readouterr().out)

    repeated = table("--fit", oci, "--fit", slower)
    assert repeated == table("--fit", oci, slower)
    assert repeated != table("--fit", slower) and repeated != table("--fit", oci)
    assert main([*base, "--fit", oci, "--fit", oci]) == 2
    assert "given twice" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    add_collective_arguments(parser)
    args = parser.parse_args(
        ["--cluster", "c", "--world-size", "8", "--fit", "a", "b", "--fit", "c"]
    )
    assert args.fit == ["a", "b", "c"]


def test_a_repeated_nccl_tests_flag_keeps_every_log(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_estimate_arguments(parser)
    oci, slower = str(DATA / "oci-bm-gpu4.8/all_reduce_p16_oke.txt"), str(_slower_copy(tmp_path))
    argv = ["--model", "m", "--world-size", "16", "--cluster", "oci-bm-gpu4.8"]
    args = parser.parse_args([*argv, "--nccl-tests", oci, "--nccl-tests", slower])
    assert args.nccl_tests == [oci, slower]
    both = cluster_link("oci-bm-gpu4.8", 16, args.nccl_tests)
    assert both.calibrated_on == (oci, slower)
    assert both.calibration != cluster_link("oci-bm-gpu4.8", 16, [slower]).calibration
    with pytest.raises(ValueError, match="given twice"):
        cluster_link("oci-bm-gpu4.8", 16, [oci, oci])


def _table_lines(text: str) -> tuple[list[str], int, int]:
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(r"^#\s+size\s+count", line))
    first_row = next(i for i, line in enumerate(lines) if re.match(r"^\s+8\s+2\s+float", line))
    return lines, header, first_row


def test_the_newest_layouts_cputime_timestamps_per_iteration_and_big_counts() -> None:
    lines, header, first_row = _table_lines(OCI)
    rows = range(first_row, first_row + len(BASE.rows))
    # -C: the time columns are "cputime"; -T: a timestamp column, printed with a space inside
    stamped = list(lines)
    stamped[header] = stamped[header].replace(" time ", " cputime ") + "  timestamp"
    for i in rows:
        stamped[i] += "  2025-11-02 20:32:20"
    run = parse_text("\n".join(stamped), "stamped.txt").run
    assert _values(run.rows) == _values(BASE.rows)
    # per-iteration timing: four more columns after each half's #wrong
    per_iter = list(lines)
    per_iter[header] = re.sub(r"#wrong", "#wrong   i_min   i_max   i_p99   i_cv%", per_iter[header])
    for i in rows:
        f = per_iter[i].split()
        per_iter[i] = "  ".join([*f[:9], "1.0", "2.0", "3.0", "4.5", *f[9:], "1.0", "2", "3", "4"])
    assert _values(parse_text("\n".join(per_iter), "iter.txt").run.rows) == _values(BASE.rows)
    # a wrong-element count of 35,584,300 prints as %g: 3.55843e+07
    big = list(lines)
    big[first_row + 3] = re.sub(r"0$", "3.55843e+07", big[first_row + 3])
    run = parse_text("\n".join(big), "big.txt").run
    assert [(s.line, s.kind) for s in run.skipped] == [(first_row + 4, "#wrong")]


def test_rank_lines_cut_by_the_page_and_rank_lines_missing() -> None:
    text = (DATA / "oci-gb300/all_reduce_p128.txt").read_text()
    run = read_log(DATA / "oci-gb300/all_reduce_p128.txt").run
    assert (run.world_size, run.num_hosts) == (128, None)  # ranks 0, 1, '...', 126, 127
    without_dots = "\n".join(line for line in text.splitlines() if line.strip() != "...")
    with pytest.raises(
        ValueError, match=r"cut\.txt:\d+: the rank lines of this run are not 0\.\.3"
    ):
        parse_text(without_dots, "cut.txt")


def test_the_bandwidth_ratio_implies_the_world_size() -> None:
    """busbw / algbw = 2(n-1)/n (all-reduce) or (n-1)/n: never another n than the rank lines',
    and the ranks of the logs that list none, as their sources state them."""
    listed = 0
    for name in [*CORPUS, *MULTI]:
        for run in read_log(DATA / name).runs:
            implied = implied_world_size(run)
            if run.world_size is not None and implied is not None:
                assert implied == run.world_size, name
                listed += 1
    assert listed >= 40
    no_ranks = {name: n for name, (n, *_rest) in CORPUS.items() if n is None}
    implied = {name: implied_world_size(read_log(DATA / name).run) for name in no_ranks}
    stated = {name: int(re.search(r"_p(\d+)", name).group(1)) for name in no_ranks}
    # too many ranks for two-decimal bandwidths to tell 127 from 129: no answer, not a wrong one
    assert {k for k, v in implied.items() if v is None} == {
        "oci-gb200/alltoall_p128.txt",
        "oci-gb200/alltoall_p192.txt",
    }
    assert all(implied[k] == stated[k] for k in implied if implied[k] is not None)


def test_every_dtype_and_redop_of_one_table_and_a_repeated_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, _header, first_row = _table_lines(OCI)
    row = lines[first_row + 20]
    as_half = row.replace("   float", "    half").replace("     sum", "    prod")
    both = [*lines[: first_row + 21], as_half, *lines[first_row + 21 :]]
    run = parse_text("\n".join(both), "types.txt").run  # nccl-tests -d all -o all: one table
    same_size = [(r.dtype, r.redop) for r in run.rows if r.num_bytes == BASE.rows[20].num_bytes]
    assert same_size == [("float", "sum"), ("half", "prod")]
    twice = [*lines[: first_row + 21], row, *lines[first_row + 21 :]]
    with pytest.raises(ValueError, match=rf"twice\.txt:{first_row + 22}: size \d+ \(float, sum\)"):
        parse_text("\n".join(twice), "twice.txt")
    # the command refuses a file of two runs without --run, listing them, and takes --run 2
    path = tmp_path / "two.txt"
    path.write_text(OCI + OCI)
    argv = ["collective", "--cluster", "oci-bm-gpu4.8", "--world-size", "16", "--fit", str(path)]
    assert main(argv) == 2
    said = "holds 2 runs (run 1 (line 25): all_reduce (inferred from the table), 16 ranks"
    assert said in capsys.readouterr().err
    assert main([*argv, "--run", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["bytes"] == 1 << 20
