"""Regenerate the golden traces in tests/data/golden_gloo2/.

Two gloo ranks (fresh processes from commprof's ``spawn_ranks``, FileStore
rendezvous) train a small DDP MLP under commprof's profiler harness. Each rank
writes its trace (``rank{r}_steps{first}-{last}.json.gz``) and the records of a
timing comm hook (``hook_buckets_rank{r}.json``: one record per bucket and
step). Then the expected metrics of the traces are computed with commprof's own
code and stored as ``expected_metrics.json``: a regression file, not an
independent oracle (the independent checks are the structural invariants in
tests/test_analyze.py and the closed-form hand-built traces).

Run from the repository root::

    python tests/data/make_golden.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(_ROOT))

WORLD_SIZE = 2
NUM_STEPS = 6
"""Training steps run; the profiler schedule below records steps 2, 3 and 4."""
WAIT, WARMUP, ACTIVE, REPEAT = 1, 1, 3, 1
BUCKET_CAP_MB = 0.25
"""Small DDP buckets (MiB) so that a step has several all-reduces."""
BATCH_SIZE = 32
SEED = 1234


def build_mlp() -> nn.Sequential:
    """A plain MLP of 493,056 parameters (256*512+512 + 512*512+512 + 512*192+192 + 192*10+10)."""
    return nn.Sequential(
        nn.Linear(256, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 192),
        nn.ReLU(),
        nn.Linear(192, 10),
    )


class HookRecorder:
    """State of a timing all-reduce hook: one record per bucket and step."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.step = 0
        self.records: list[dict[str, Any]] = []


def timed_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
    """Average the bucket with all_reduce and record its launch and completion times.

    No annotations: DDP compares them to ``dist.GradBucket`` and rejects the
    strings that ``from __future__ import annotations`` makes of them.
    """
    buffer = bucket.buffer()
    record: dict[str, Any] = {
        "rank": state.rank,
        "step": state.step,
        "bucket_index": bucket.index(),
        "num_bytes": buffer.numel() * buffer.element_size(),
        "num_params": len(bucket.parameters()),
        "launch_ns": time.perf_counter_ns(),
    }
    state.records.append(record)
    fut = dist.all_reduce(buffer.div_(state.world_size), async_op=True).get_future()

    def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        # Runs on a gloo worker thread: only record, never block here.
        record["done_ns"] = time.perf_counter_ns()
        record["latency_ns"] = record["done_ns"] - record["launch_ns"]
        return f.value()[0]

    return fut.then(done)


def worker(rank: int, world_size: int, store_path: str, out_dir: str) -> None:
    """One rank: DDP training under the profiler harness."""
    from commprof.profiling.harness import profiled
    from commprof.training.launcher import process_group

    store = dist.FileStore(store_path, world_size)
    with process_group(backend="gloo", rank=rank, world_size=world_size, store=store):
        torch.manual_seed(SEED)
        model = DistributedDataParallel(build_mlp(), bucket_cap_mb=BUCKET_CAP_MB)
        recorder = HookRecorder(rank, world_size)
        model.register_comm_hook(recorder, timed_allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(SEED + rank)
        with profiled(
            out_dir, rank=rank, wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT
        ) as prof:
            for step in range(NUM_STEPS):
                recorder.step = step
                x = torch.randn(BATCH_SIZE, 256, generator=gen)
                y = torch.randint(0, 10, (BATCH_SIZE,), generator=gen)
                opt.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                prof.step()
        hook_path = Path(out_dir) / f"hook_buckets_rank{rank}.json"
        hook_path.write_text(json.dumps(recorder.records, indent=1) + "\n")


def make_traces(out_dir: Path) -> None:
    """Spawn the two ranks and write their traces and hook records into ``out_dir``."""
    from commprof.training.launcher import spawn_ranks

    out_dir.mkdir(parents=True, exist_ok=True)
    spawn_ranks(worker, WORLD_SIZE, args=(str(out_dir),), limit_s=300)


def write_expected(out_dir: Path) -> None:
    """Compute the metrics of the traces in ``out_dir`` into expected_metrics.json."""
    from commprof.traces.analyze import analyze_dir
    from commprof.traces.report_text import step_json_rows

    tables = analyze_dir(out_dir)
    records = step_json_rows(tables["steps"])
    (out_dir / "expected_metrics.json").write_text(json.dumps(records, indent=1) + "\n")


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent / "golden_gloo2"
    for old in out_dir.glob("*.json*"):
        old.unlink()
    make_traces(out_dir)
    write_expected(out_dir)
    for path in sorted(out_dir.iterdir()):
        print(f"{path}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
