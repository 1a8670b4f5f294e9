"""A gang whose actors start slowly is waited for longer, with a warning, before it is torn down
(``commprof.sweeps.pool.GangPool._still_starting``): on a loaded host a new gang would only start
over. The clock is the pool module's; no actor is started here (the sweep tests start real ones)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from commprof.sweeps import pool


def test_a_slow_gang_is_waited_for_longer_then_given_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [100.0]
    monkeypatch.setattr(pool.time, "monotonic", lambda: clock[0])
    gangs = pool.GangPool(ready_timeout_s=10.0)
    waiting = pool.Reservation(
        shape=(2, "cpu", "PACK"), group=None, ready=None,  # type: ignore[arg-type]
        gang=SimpleNamespace(where=["rank0", "rank1"]),  # type: ignore[arg-type]
        spawned=100.0, patience_s=10.0,
    )  # fmt: skip
    seen = []
    with caplog.at_level(logging.WARNING, logger=pool.log.name):
        for now in (105.0, 111.0, 129.0, 131.0, 169.0, 171.0):
            clock[0] = now
            seen.append((now, gangs._still_starting(waiting, []), waiting.patience_s))
    # 10 s, then 20 s more, then 40 s more (GANG_START_TRIES periods), then given up
    assert pool.GANG_START_TRIES == 3
    assert seen == [
        (105.0, True, 10.0), (111.0, True, 30.0), (129.0, True, 30.0),
        (131.0, True, 70.0), (169.0, True, 70.0), (171.0, False, 70.0),
    ]  # fmt: skip
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "0 of 2 actors started in 11 s" in warned[0]
    assert "waiting up to 70 s in all" in warned[1]
