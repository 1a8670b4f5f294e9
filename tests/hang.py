"""The one wall-clock limit a test may set on something it waits for: a hang guard."""

from __future__ import annotations

GUARD_S = 1800.0
"""Only a run that hangs reaches it: a test asserts outcomes, never that something ended within
a time tuned to one host. Under a CPU hog of twice the cores beside a second suite, the load
reached 38 on a 2-core machine and runs that take a minute unloaded took over ten."""
