"""Model variants on a development collection of ``bench_step_model.py`` (``--collect-only``).

Used once, before the seventh run, to choose among candidate calibrations on data that is
neither that run's nor scored by it (``results/step_model_v7_dev_data``, 4 rounds): the link
fit on the median or the mean time (``step_advice.LINK_TIME``), and the interference rows of
the calibration cells only (``own``) or of every cell of the host (``host``, the default from
the seventh run). Prints the analysis summary per variant.

Usage: ``python benchmarks/step_model_variants.py results/step_model_v7_dev_data``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import step_model_analysis

from commprof.modeling import step_advice

VARIANTS = (("time_mean_ns", "host"), ("time_mean_ns", "own"), ("time_p50_ns", "host"),
            ("time_p50_ns", "own"))  # fmt: skip


def main() -> int:
    data = Path(sys.argv[1])
    host = step_advice.host_interference
    for link_time, interference in VARIANTS:
        step_advice.LINK_TIME = link_time

        def own(tables: dict[str, pd.DataFrame], cell_id: str) -> pd.DataFrame:
            cells = set(step_advice.repeats_of(tables, cell_id))
            rows = tables["interference"]
            return rows[rows["cell_id"].isin(cells)]

        step_advice.host_interference = host if interference == "host" else own  # type: ignore[assignment]
        report = step_model_analysis.analyze(data)
        for split in ("summary", "summary_round0"):
            for name, row in report[split].items():
                print(link_time, interference, split, name, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
