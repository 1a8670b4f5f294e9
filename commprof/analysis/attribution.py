"""Per-layer communication attribution, and the measured overheads of the instrumentation.

Attribution: a bucket's all-reduce moves the gradients of the parameters in it
(``bucket_params``), so each parameter is charged the share of the bucket's time that its bytes
are of the bucket's bytes, ``t_param = t_bucket * bytes_param / bytes_bucket``; a module (layer)
is charged the sum over its parameters. The time attributed is the bucket's median service time
(``transfer_ns``: its own all-reduce, without the wait behind earlier buckets), so a cell's
modules add up to its all-reduce time per step (``allreduce_sum_measured_ns``). Latencies
(``done - ready``) are not attributed: they hold queueing, and a sum of them counts a transfer
once for every bucket that waited behind it. Per-bucket exposed times are not attributed either:
buckets run concurrently on gloo's threads, so their exposed parts overlap and their sum exceeds
the step's exposed time.

Overheads, as measured in the dataset itself:

- hook critical path: ``launch_ns - ready_ns`` per bucket, the time from hook entry until the
  collective is enqueued (the timing wrapper's clock reads plus the inner hook's enqueue): an
  upper bound on what the timing hook adds to backward;
- profiler: where the dataset holds the same configuration with and without ``profile``, the
  ratio of their median step times (profiled / unprofiled).

This module imports no torch and no ray.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from commprof.analysis.per_cell import CONFIG_COLUMNS


def layer_attribution(bucket_stats: pd.DataFrame, bucket_params: pd.DataFrame) -> pd.DataFrame:
    """Communication time charged to each module of each ok cell.

    Args:
        bucket_stats: ``modelled.bucket_table`` output (per-bucket medians of ok cells).
        bucket_params: the dataset's ``bucket_params`` table.

    Returns:
        Columns ``cell_id, attempt, module, module_type`` (the class name; empty in datasets
        from before the column), ``label`` (:func:`module_label`), ``num_bytes`` and
        ``transfer_ns`` (attributed service time, float ns), sorted by cell and descending time.
    """
    keys = ["cell_id", "attempt", "bucket_index"]
    columns = ["cell_id", "attempt", "module", "module_type", "label", "num_bytes", "transfer_ns"]
    params = bucket_params.merge(bucket_stats[[*keys, "transfer_ns"]], on=keys, how="inner")
    if params.empty:
        return pd.DataFrame(columns=columns)
    if "module_type" not in params:
        params = params.assign(module_type="")
    params = params.assign(module_type=params["module_type"].fillna("").astype(str))
    bucket_bytes = params.groupby(keys)["num_bytes"].transform("sum").astype(np.float64)
    params = params.assign(transfer_ns=params["transfer_ns"] * params["num_bytes"] / bucket_bytes)
    out = (
        params.groupby(["cell_id", "attempt", "module", "module_type"])[
            ["num_bytes", "transfer_ns"]
        ]
        .sum()
        .reset_index()
    )
    out["label"] = [
        module_label(m, t) for m, t in zip(out["module"], out["module_type"], strict=True)
    ]
    out = out.sort_values(["cell_id", "transfer_ns"], ascending=[True, False])
    return out[columns].reset_index(drop=True)


def module_label(module: str, module_type: str) -> str:
    """A module as a person reads it: its qualified name and its class, as PyTorch prints a
    model (``blocks.3.fc1: Linear``, ``2: Linear`` for an ``nn.Sequential`` index, ``(root):
    Sequential``); without a recorded class (older datasets) the name, a bare index as
    ``module 2``.
    """
    name = module or "(root)"
    if module_type:
        return f"{name}: {module_type}"
    return f"module {name}" if name.isdigit() else name


def hook_overhead(measured_buckets: pd.DataFrame) -> pd.DataFrame:
    """Hook critical-path time per bucket (``launch_ns - ready_ns``), summarised per cell.

    Args:
        measured_buckets: ``per_cell.bucket_samples`` output.

    Returns:
        Columns ``cell_id, attempt, num_buckets, hook_median_ns, hook_p95_ns,
        hook_per_step_ns`` (median over ranks and steps of the per-step sum).
    """
    b = measured_buckets.assign(
        hook_ns=measured_buckets["launch_ns"] - measured_buckets["ready_ns"]
    )
    per_bucket = b.groupby(["cell_id", "attempt"])["hook_ns"]
    per_step = b.groupby(["cell_id", "attempt", "rank", "step"])["hook_ns"].sum()
    out = pd.DataFrame(
        {
            "num_buckets": per_bucket.size(),
            "hook_median_ns": per_bucket.median(),
            "hook_p95_ns": per_bucket.quantile(0.95),
            "hook_per_step_ns": per_step.groupby(["cell_id", "attempt"]).median(),
        }
    )
    return out.reset_index()


def profiler_overhead(summary: pd.DataFrame) -> pd.DataFrame:
    """Step-time cost of the profiler, where a configuration ran with and without it.

    Args:
        summary: ``per_cell.cell_summary`` output.

    Returns:
        Columns ``model, world_size, bucket_cap_mb, step_plain_ns, step_profiled_ns, ratio``;
        empty when no configuration ran both ways.
    """
    columns = ["model", "world_size", "bucket_cap_mb", "step_plain_ns", "step_profiled_ns"]
    keys = [c for c in CONFIG_COLUMNS if c not in ("profile", "num_params")]
    if summary.empty or summary["profile"].nunique() < 2:
        return pd.DataFrame(columns=[*columns, "ratio"])
    med = (  # dropna=False: a cap left unset (NaN) is a configuration too
        summary.groupby([*keys, "profile"], dropna=False)["step_ns_median"]
        .median()
        .unstack("profile")
    )
    med = med.dropna().reset_index()
    out = med.rename(columns={False: "step_plain_ns", True: "step_profiled_ns"})
    out["ratio"] = out["step_profiled_ns"] / out["step_plain_ns"]
    return out[[*columns, "ratio"]]
