"""Model variants on development collections of ``bench_step_model.py`` (``--collect-only``).

Used before the eighth run to choose the link's calibration on data that run does not score:
``results/step_model_v7_dev_data`` (4 rounds) and the seventh run's ``results/step_model_v7_data``
(10 rounds; scored by the seventh run, development data for the eighth). The variants: the
per-operation stall of the microbenchmarks (``step_advice.link_stall_ns``) added to each
bucket or not, and the link fitted on the calibration cells of every model (``host``, the
eighth run's) or on the model's own calibration repeats only (``own``). Prints the analysis
summary per variant. (The seventh run's link, a fit of mean times per row, is no longer in the
code; its figures on the same data are the seventh run's and ``step_model_v7_dev.txt``.)

Usage: ``python benchmarks/step_model_variants.py results/step_model_v7_dev_data ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import step_model_analysis

from commprof.modeling import step_advice

VARIANTS = (("stall", "host"), ("stall", "own"), ("no stall", "host"), ("no stall", "own"))


def main() -> int:
    stall_of, host_cells = step_advice.link_stall_ns, step_model_analysis._link_cells
    for data in sys.argv[1:]:
        for stall, cells in VARIANTS:

            def no_stall(rows: pd.DataFrame) -> float:
                return 0.0

            def own(measured: pd.DataFrame, split: str) -> list[str]:
                return []  # the calibration repeats alone (load_step_model always adds them)

            step_advice.link_stall_ns = stall_of if stall == "stall" else no_stall  # type: ignore[assignment]
            step_model_analysis._link_cells = host_cells if cells == "host" else own  # type: ignore[assignment]
            report = step_model_analysis.analyze(Path(data))
            for split in ("summary", "summary_round0"):
                for name, row in report[split].items():
                    print(Path(data).name, stall, cells, split, name, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
