"""Launcher: rank errors grouped by text, and a cell that fails in every rank."""

from __future__ import annotations

import pytest
import torch

from commprof.matrix import Cell
from commprof.training.launcher import RankFailure, group_errors, run_local


def test_group_errors_groups_by_first_line() -> None:
    errors = {
        2: "ValueError: bad\nTraceback (most recent call last): rank 2 frame",
        0: "ValueError: bad\nTraceback (most recent call last): rank 0 frame",
        1: "RuntimeError: peer closed\n...",
        3: "",
    }
    assert group_errors(errors) == (
        "4 rank(s) failed; ranks [0, 2]: ValueError: bad; "
        "ranks [1]: RuntimeError: peer closed; ranks [3]: ?"
    )


def test_group_errors_single_rank() -> None:
    assert (
        group_errors({5: "  OSError: disk full  \n"})
        == "1 rank(s) failed; ranks [5]: OSError: disk full"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_every_rank_failing_gives_one_group() -> None:
    # device='cuda' raises in every rank before it joins the group: both report the same text.
    cell = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1.0, device="cuda", steps=3)
    with pytest.raises(RankFailure) as info:
        run_local(cell, timeout_s=30)
    message = str(info.value)
    assert message.startswith("2 rank(s) failed; ranks [0, 1]: ")
    assert "asks for device 'cuda'" in message
    assert message.count("ranks [") == 1
    assert "Traceback" not in message  # one line per group, not the whole traceback
