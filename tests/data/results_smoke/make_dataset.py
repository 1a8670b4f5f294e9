"""Regenerate this committed dataset: four small matrices run into one folder on CPU/gloo.

    . .venv/bin/activate
    PYTHONPATH=. python tests/data/results_smoke/make_dataset.py /tmp/results_smoke

- matrices/main.yaml: srn-100k and srn-1m, 2 and 4 ranks, bucket caps 0.25, 1 and 25 MiB;
  rank 1 of one cell raises on attempt 1 (fault injection), so that cell is ok on attempt 2;
- matrices/repeat.yaml: repeats 1 and 2 of two srn-1m configurations (repeat 0 is in main);
- matrices/guard.yaml: srn-400m against an 8 GB host-RAM budget: rejected by the memory guard;
- matrices/fail.yaml: one cell whose rank 1 raises on its only attempt: failed;
- matrices/profile.yaml: an srn-1m cell also traced with torch.profiler (trace_metrics); the
  same configuration unprofiled is in main, so the report can quote the profiler's overhead;
- matrices/hook_cost.yaml: srn-100k and srn-1m at 4 MiB, each with 12 pairs of the hooked model
  against a plain DDP replica after its measured steps (the hook_cost table).

Then copy the table folders (cells, steps, buckets, bucket_params, microbench, trace_metrics,
hook_cost) here (not traces/: the metrics are what the report reads). It took about 4 minutes
on a shared 2-core machine. Names after the folder run only those matrices (``hook_cost``):
the first five ran before the dataset's checksums, the hook_cost table and the modules' classes
existed, and were not run again when hook_cost.yaml was added, so the dataset mixes attempts
with and without them, as a folder resumed across versions does.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import ray  # noqa: E402

from commprof import matrix  # noqa: E402
from commprof.sweeps.driver import Driver, DriverOptions  # noqa: E402
from commprof.sweeps.run_matrix import connect  # noqa: E402


MATRICES = ("main", "repeat", "guard", "fail", "profile", "hook_cost")


def main(out: Path, names: tuple[str, ...] = MATRICES) -> None:
    connect(None, num_cpus=4)
    try:
        for name in names:
            mx = matrix.load(HERE / "matrices" / f"{name}.yaml")
            faults = {}
            if name == "main":  # attempt 1 fails, attempt 2 succeeds
                cell = next(
                    c for c in mx.cells
                    if c.model == "srn-100k" and c.world_size == 2 and c.bucket_cap_mb == 1
                )
                faults[cell.cell_id] = {"rank": 1, "kind": "raise"}
            if name == "fail":  # max_attempts: 1, so the cell stays failed
                faults[mx.cells[0].cell_id] = {"rank": 1, "kind": "raise"}
            print(name, Driver(mx, DriverOptions(out=out, faults=faults)).run(), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), tuple(sys.argv[2:]) or MATRICES)
