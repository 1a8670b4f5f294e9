"""commprof: where the communication time of data-parallel PyTorch training goes.

The sub-packages ``commprof.actors``, ``commprof.sweeps`` and ``commprof.reporting`` live in the
repository's top-level folders ``actors/``, ``sweeps/`` and ``reporting/``. A wheel installs them
under ``commprof/`` (see ``pyproject.toml``); in a source checkout (an editable install, or the
checkout Ray ships to cluster nodes as its working directory) the repository root is added to this
package's search path so that the same names resolve to those folders.
"""

from pathlib import Path

__version__ = "0.1.0"

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "sweeps" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))
