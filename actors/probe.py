"""The memory budgets of a cluster node, measured on the node by a small Ray task."""

from __future__ import annotations

from commprof.modeling import memory


def node_budgets(include_cuda: bool) -> memory.Budgets:
    """Budgets of the node this runs on; with ``include_cuda`` its GPUs too (imports torch in
    the task's worker process, never in the driver). Positional: Ray's typed ``.remote()`` does
    not take keyword-only arguments."""
    if not include_cuda:
        return memory.detect_budgets()
    from commprof.training.devices import detect_budgets

    return detect_budgets()
