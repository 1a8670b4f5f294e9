"""nccl-tests / rccl-tests output as input: the reader's names.

The reader is :mod:`commprof.modeling.collective.nccl_log` (logs as clusters print them:
launcher prefixes, interleaved NCCL lines, several runs a file, 0-byte and wrong rows counted);
its names are re-exported here for the modules that read logs through this one. Calibration of
the model on these logs is :mod:`commprof.modeling.collective.calibration`.
"""

from __future__ import annotations

from commprof.modeling.collective.nccl_log import (  # noqa: F401 -- re-exported
    parse_text,
    read_log,
    read_logs,
)
from commprof.modeling.collective.nccl_log_collective import (  # noqa: F401 -- re-exported
    check_collective,
    log_world_size,
)
from commprof.modeling.collective.nccl_log_runs import (  # noqa: F401 -- re-exported
    NcclTestsLog,
    Row,
    Run,
)
