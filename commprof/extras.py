"""The optional half of commprof: torch and Ray come with the ``run`` extra.

``pip install commprof`` gives what reads traces and datasets (``analyze``, ``estimate``,
``collective``, ``report`` and ``commprof.results``) without torch or Ray;
``pip install 'commprof[run]'`` adds them for ``run``, ``sweep`` and ``commprof.attach``. A
torch-free module that can use Ray on request (``analyze --ray``, ``results.load_dataset``)
imports it here, so a missing extra is one line that says what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

RUN_EXTRA = "run"
"""The extra that adds torch and Ray (``pyproject.toml``, ``[project.optional-dependencies]``)."""
EXTRA_MODULES = ("torch", "ray")
"""Top-level modules the extra provides."""


class MissingExtra(ImportError):
    """A command or function needs torch or Ray, and this install has not got them."""

    def __init__(self, module: str, needed_by: str) -> None:
        super().__init__(
            f"{needed_by} needs {module}, which the light install leaves out: "
            f"pip install 'commprof[{RUN_EXTRA}]' (or install {module} yourself)"
        )
        self.module = module


def require(module: str, *, needed_by: str) -> ModuleType:
    """Import ``module`` (``ray``, ``ray.data``, ``torch``) or raise :class:`MissingExtra`.

    Args:
        module: dotted module name; its top-level package must be one of :data:`EXTRA_MODULES`.
        needed_by: what needs it, as the user called it (``commprof analyze --ray``).
    """
    top = module.partition(".")[0]
    if top not in EXTRA_MODULES:
        raise ValueError(f"{module!r} does not come with the {RUN_EXTRA!r} extra")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] != top:
            raise  # something else is missing: not the extra's to explain
        raise MissingExtra(top, needed_by) from None


def missing_extra(err: ModuleNotFoundError, needed_by: str) -> MissingExtra | None:
    """The :class:`MissingExtra` a failed import of torch or Ray means, else None."""
    top = (err.name or "").partition(".")[0]
    return MissingExtra(top, needed_by) if top in EXTRA_MODULES else None
