"""Model variants on development collections of ``bench_step_model.py``.

Used before the tenth run to choose what the step model's exposed communication is, on data that
run does not score: the 4-round ``results/step_model_v7_dev_data`` and the seventh, eighth and
ninth runs' collections (each scored by its own run, development data from then on). The
variants: ``straggler`` (the tenth run's: a rank's exposed time counts its wait for the slowest
rank, ``StepCalibration.rank_wait_ns``, as the timing hook measures it) and ``slowest rank``
(the simulator's own, the ninth run's). Prints the analysis summary per variant. The eighth
run's variants (the link's stall and cells, ``results/step_model_v8_dev.txt``) came from this
script's earlier version (git history).

Usage: ``python benchmarks/step_model_variants.py results/step_model_v9_data ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import step_model_analysis

from commprof.modeling import step_model
from commprof.modeling.step_sim import StepPrediction

VARIANTS = ("straggler", "slowest rank")


def main() -> int:
    with_rank_wait = step_model.with_rank_wait
    for data in sys.argv[1:]:
        for variant in VARIANTS:

            def slowest(prediction: StepPrediction, wait_ns: float) -> StepPrediction:
                return prediction

            step_model.with_rank_wait = with_rank_wait if variant == "straggler" else slowest  # type: ignore[assignment]
            report = step_model_analysis.analyze(Path(data))
            for split in ("summary", "summary_round0"):
                for name, row in report[split].items():
                    print(Path(data).name, variant, split, name, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
