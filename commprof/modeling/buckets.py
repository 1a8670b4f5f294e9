"""DDP gradient bucket assignment, computed the way PyTorch DDP does it (no torch needed).

What DDP (torch 2.13, ``nn/parallel/distributed.py`` and the C++
``compute_bucket_assignment_by_size`` in ``reducer.cpp``) really does, verified
against ``DistributedDataParallel._get_ddp_logging_data()`` and a comm hook in
``tests/test_buckets.py``:

* Step 0: with the defaults (``find_unused_parameters=False``,
  ``static_graph=False``) the initial bucket limit is ``sys.maxsize``, so the
  whole model is ONE bucket in the first backward.
* The order in which gradients became ready in step 0 is recorded, and the
  buckets are rebuilt in the forward of step 1; steps >= 1 use the rebuilt
  buckets. (The logging data reports ``rebuilt_bucket_sizes`` one iteration
  later, from step 2 on; the comm hook sees the new buckets in step 1.)
* Rebuilt buckets take parameters in gradient-ready order, which for a model
  whose layers run in registration order is the reverse registration order
  (this module assumes exactly that). Parameters are grouped by (dtype,
  device); each parameter goes whole into the open bucket of its group; the
  bucket closes as soon as its size is >= its limit, so a bucket can exceed
  the cap by up to one parameter and is never split.
* Limits: the first bucket of each group has ``first_bucket_bytes_cap``, the
  others ``bucket_bytes_cap = int(bucket_cap_mb * 2**20)`` (MiB). The first
  cap is ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB when ``bucket_cap_mb``
  is left at its default (25 MiB), and equal to the cap when one is given.
* Leftover open buckets close at the end, one per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from commprof.caps import DDP_DEFAULT_CAP_MB

MIB = 1 << 20
"""Bytes in one MiB; DDP's ``bucket_cap_mb`` is in MiB."""
DEFAULT_BUCKET_CAP_MB = DDP_DEFAULT_CAP_MB
"""DDP's default ``bucket_cap_mb`` (one value, ``commprof.caps``)."""
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB
"""``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``."""
DEFAULT_ELEMENT_SIZE_BYTES = 4
"""float32 gradients unless a parameter says otherwise."""

ParamSize = tuple[str, int] | tuple[str, int, int]
"""``(name, numel)`` or ``(name, numel, element_size_bytes)``, in registration order."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Bucket:
    """One DDP gradient bucket."""

    index: int
    """Position in launch order (0 is reduced first: the last layers)."""
    param_indices: tuple[int, ...]
    """Registration indices of its parameters, in gradient-ready order."""
    param_names: tuple[str, ...]
    """Names of its parameters, same order as ``param_indices``."""
    num_bytes: int
    """Sum of numel * element size of its parameters."""
    size_limit_bytes: int
    """The limit it was filled against."""
    num_params: int = field(init=False)
    """Number of parameters in the bucket."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_params", len(self.param_indices))


def bucket_cap_bytes(bucket_cap_mb: float | None) -> tuple[int, int]:
    """DDP's (first bucket cap, bucket cap) in bytes for a ``bucket_cap_mb``.

    Args:
        bucket_cap_mb: The DDP argument in MiB; None means DDP's default.

    Returns:
        ``(first_bucket_bytes_cap, bucket_bytes_cap)``.
    """
    if bucket_cap_mb is None:
        return DEFAULT_FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_CAP_MB * MIB)
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0 (MiB), got {bucket_cap_mb!r}")
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


def _normalise(param_sizes: Sequence[ParamSize]) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    for i, item in enumerate(param_sizes):
        if len(item) == 2:
            name, numel = item  # type: ignore[misc]
            elem = DEFAULT_ELEMENT_SIZE_BYTES
        elif len(item) == 3:
            name, numel, elem = item  # type: ignore[misc]
        else:
            raise ValueError(f"param_sizes[{i}] must be (name, numel[, element_size_bytes])")
        if int(numel) < 0 or int(elem) <= 0:
            raise ValueError(
                f"param_sizes[{i}] ({name!r}): numel must be >= 0 and element size > 0, "
                f"got numel={numel!r}, element_size_bytes={elem!r}"
            )
        out.append((str(name), int(numel), int(elem)))
    return out


def assign_buckets_by_size(
    sizes_bytes: Sequence[int],
    size_limits_bytes: Sequence[int],
    *,
    order: Sequence[int] | None = None,
    group_keys: Sequence[object] | None = None,
) -> list[tuple[list[int], int]]:
    """The greedy of ``compute_bucket_assignment_by_size`` (reducer.cpp).

    Args:
        sizes_bytes: Bytes of each tensor, by registration index.
        size_limits_bytes: Limits used in turn; the last one repeats.
        order: Indices in the order they are offered (default: as given).
        group_keys: Per-tensor key (dtype, device); tensors of different keys
            never share a bucket. Default: one group.

    Returns:
        ``(indices, limit)`` per bucket, in the order buckets closed, leftovers
        last (one per group, in first-seen order).
    """
    if not size_limits_bytes:
        raise ValueError("size_limits_bytes must not be empty")
    offered = list(range(len(sizes_bytes))) if order is None else list(order)
    keys = [0] * len(sizes_bytes) if group_keys is None else list(group_keys)
    open_: dict[object, tuple[list[int], int]] = {}
    limit_pos: dict[object, int] = {}
    result: list[tuple[list[int], int]] = []
    for idx in offered:
        key = keys[idx]
        indices, size = open_.get(key, ([], 0))
        indices.append(idx)
        size += sizes_bytes[idx]
        pos = limit_pos.setdefault(key, 0)
        limit = size_limits_bytes[pos]
        if size >= limit:
            result.append((indices, limit))
            open_.pop(key, None)
            limit_pos[key] = min(pos + 1, len(size_limits_bytes) - 1)
        else:
            open_[key] = (indices, size)
    for key, (indices, _) in open_.items():
        result.append((indices, size_limits_bytes[limit_pos[key]]))
    return result


def assign_buckets(
    param_sizes: Sequence[ParamSize],
    *,
    bucket_cap_mb: float | None = None,
    first_bucket_bytes: int | None = None,
) -> list[Bucket]:
    """DDP's rebuilt buckets (steps >= 1) for parameters in registration order.

    Gradients are assumed ready in reverse registration order (see module doc).

    Args:
        param_sizes: ``(name, numel[, element_size_bytes])`` in registration order.
        bucket_cap_mb: DDP's ``bucket_cap_mb`` (MiB); None means DDP's default.
        first_bucket_bytes: Override of the first bucket cap in bytes.

    Returns:
        Buckets in launch order (index 0 holds the last-registered parameters).
    """
    params = _normalise(param_sizes)
    if not params:
        raise ValueError("param_sizes is empty: a model needs at least one parameter")
    first_cap, cap = bucket_cap_bytes(bucket_cap_mb)
    if first_bucket_bytes is not None:
        if first_bucket_bytes <= 0:
            raise ValueError(f"first_bucket_bytes must be > 0, got {first_bucket_bytes!r}")
        first_cap = first_bucket_bytes
    sizes = [numel * elem for _, numel, elem in params]
    keys = [elem for _, _, elem in params]
    order = list(reversed(range(len(params))))
    groups = assign_buckets_by_size(sizes, [first_cap, cap], order=order, group_keys=keys)
    return [
        Bucket(
            index=b,
            param_indices=tuple(indices),
            param_names=tuple(params[i][0] for i in indices),
            num_bytes=sum(sizes[i] for i in indices),
            size_limit_bytes=limit,
        )
        for b, (indices, limit) in enumerate(groups)
    ]
