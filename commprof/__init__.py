"""commprof: where the communication time of data-parallel PyTorch training goes.

The sub-packages ``commprof.actors``, ``commprof.sweeps`` and ``commprof.reporting`` live in the
repository's top-level folders ``actors/``, ``sweeps/`` and ``reporting/``. A wheel installs them
under ``commprof/`` (see ``pyproject.toml``); in a source checkout (an editable install, or the
checkout Ray ships to cluster nodes as its working directory) the repository root is added to this
package's search path so that the same names resolve to those folders.

``commprof.attach`` (commprof inside your own training) is loaded on first use: ``import
commprof`` stays free of torch.
"""

from pathlib import Path
from typing import Any

__version__ = "0.2.0"

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "sweeps" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))


def __getattr__(name: str) -> Any:
    """``commprof.attach``, imported when first asked for (it needs torch)."""
    if name == "attach":
        from commprof.training.session import attach

        return attach
    raise AttributeError(f"module 'commprof' has no attribute {name!r}")
