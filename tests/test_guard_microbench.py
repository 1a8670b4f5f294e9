"""The memory guard costs the all-reduce microbenchmark's buffers as the microbenchmark uses
them: its peak, measured as a real rank's peak RSS, against the guard's term."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commprof.modeling import memory
from commprof.training.trainer import CALIBRATION_SIZES_BYTES
from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
SIZE_BYTES = 64 * 2**20
"""The measured message: large against the interpreter's own allocations, small for the host."""

MEASURE = """
import json, os, resource, sys, tempfile
import torch, torch.distributed as dist
from commprof.training.microbench import MicrobenchConfig, run_allreduce_bench
store = dist.FileStore(tempfile.mktemp(), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
# a first run at 1 MiB pages in the code the benchmark runs, just before the baseline: the
# measured run's growth is then its buffers alone, not torch's kernels faulted in for the first
# time, nor start-up's file-backed pages that a loaded host dropped and the run faults back in
small = MicrobenchConfig(sizes_bytes=(2**20,), warmup_iters=1, timed_iters=2)
run_allreduce_bench(small, rank=0, world_size=1, device="cpu")
# the resident size now, not the high-water mark: start-up may have peaked above it; and the
# file-backed part of it (statm's "shared"), since pages of code and libraries that a loaded host
# dropped and the run faults back in count in the high-water mark but are no buffer
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    fields = open("/proc/self/statm").read().split()
    return int(fields[1]) * page, int(fields[2]) * page
before, file_before = resident()
config = MicrobenchConfig(sizes_bytes=(int(sys.argv[1]),), warmup_iters=1, timed_iters=2)
run_allreduce_bench(config, rank=0, world_size=1, device="cpu")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
refaulted = max(0, resident()[1] - file_before)
print(json.dumps({"peak_bytes": after - before - refaulted, "refaulted_bytes": refaulted}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_guard_term_covers_the_microbenchmark_peak() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(SIZE_BYTES)],
        env={**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"},
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=True,
    )
    peak = json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]
    term = memory.MICROBENCH_PEAK_FACTOR * SIZE_BYTES
    # the docstring's count is 8.25 S (33 bytes per float32 element), what this measures
    assert 7 * SIZE_BYTES < peak <= term, (peak / SIZE_BYTES, memory.MICROBENCH_PEAK_FACTOR)


def test_the_default_sizes_are_the_trainers() -> None:
    assert max(CALIBRATION_SIZES_BYTES) == memory.DEFAULT_MICROBENCH_MAX_BYTES


def _shape(cap_mb: float) -> memory.CellShape:
    return memory.CellShape(
        model="srn-10m",
        world_size=2,
        ranks_per_node=2,
        backend="gloo",
        device="cpu",
        batch_size=8,
        bucket_cap_mb=cap_mb,
    )


def test_the_largest_bucket_bounds_the_microbenchmark_too() -> None:
    fp = memory.model_footprint("srn-10m")
    model_bytes, largest_bytes = 4 * fp.num_parameters, 4 * fp.largest_param_elements
    assert model_bytes > memory.DEFAULT_MICROBENCH_MAX_BYTES  # the bucket decides here
    # one bucket holds the whole model: its microbenchmark all-reduces the model's bytes
    assert memory.microbench_largest_bytes(_shape(2.0**20), fp) == model_bytes
    # a 1 MiB cap: a bucket closes past the cap, so at most the cap and one parameter
    capped = min(model_bytes, 2**20 + largest_bytes)
    expected = max(memory.DEFAULT_MICROBENCH_MAX_BYTES, capped)
    assert memory.microbench_largest_bytes(_shape(1.0), fp) == expected
