"""What torch knows of this machine's devices, for the torch-free memory guard."""

from __future__ import annotations

import torch

from commprof.modeling import memory


def cuda_memory_bytes() -> int:
    """Total memory of the smallest visible GPU (the one a rank may get); 0 without CUDA."""
    if not torch.cuda.is_available():
        return 0
    count = torch.cuda.device_count()
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(count))


def detect_budgets() -> memory.Budgets:
    """This machine's budgets (:func:`commprof.modeling.memory.detect_budgets`), GPUs included."""
    return memory.detect_budgets(device_bytes=cuda_memory_bytes())
