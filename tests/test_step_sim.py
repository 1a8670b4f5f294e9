"""The DDP step simulator on timelines whose outcome is known in closed form."""

from __future__ import annotations

import math

import pytest

from commprof.modeling.step.simulator import NO_INTERFERENCE, Interference, simulate_step


def _flat(comm: float, compute: float) -> Interference:
    """The same slowdowns at every size."""
    return Interference(sizes_bytes=(1.0,), comm_slowdown=(comm,), compute_slowdown=(compute,))


def test_fully_hidden() -> None:
    # bucket 0 ready at 10 of 100 ns of compute, 5 ns to reduce: done at 15; the last bucket
    # (nothing to reduce) is entered when compute ends at 100: nothing exposed
    p = simulate_step(
        ready_work_ns=[10, 100], service_ns=[5, 0], num_bytes=[8, 8], compute_work_ns=100,
        forward_ns=7, optimizer_ns=3, other_ns=1,
    )  # fmt: skip
    assert (p.buckets[0].start_ns, p.buckets[0].end_ns) == (10, 15)
    assert p.exposed_ns == 0 and p.comm_busy_ns == 5 and p.overlap_efficiency == 1.0
    assert p.compute_end_ns == 100 and p.backward_ns == 100
    assert p.step_ns == 7 + 100 + 3 + 1


def test_one_bucket_overlaps_nothing_by_the_hooks_definition() -> None:
    # The timing hook's compute ends at the last hook entry (analysis.breakdown): a model in one
    # bucket overlaps nothing, as a one-bucket cell measures, even where the simulated compute
    # goes on after the hand-over (90 ns of work past the bucket's 10)
    p = simulate_step(ready_work_ns=[10], service_ns=[5], num_bytes=[8], compute_work_ns=100)
    assert p.exposed_ns == 15 - 10 and p.comm_busy_ns == 5 and p.overlap_efficiency == 0.0
    assert p.backward_ns == 100  # backward still ends with the compute


def test_fully_exposed_one_bucket() -> None:
    # the only bucket is ready when compute ends: all of its 50 ns is exposed
    p = simulate_step(ready_work_ns=[100], service_ns=[50], num_bytes=[8])
    assert p.exposed_ns == 50 and p.comm_busy_ns == 50 and p.overlap_efficiency == 0.0
    assert p.step_ns == 100 + 50


def test_queue_serialises_on_one_channel() -> None:
    # three 40 ns buckets ready at 10, 20, 30 (compute ends at 30): FIFO, back to back
    p = simulate_step(
        ready_work_ns=[10, 20, 30], service_ns=[40, 40, 40], num_bytes=[1, 1, 1], num_channels=1
    )
    assert [(b.start_ns, b.end_ns) for b in p.buckets] == [(10, 50), (50, 90), (90, 130)]
    assert p.exposed_ns == 130 - 30
    assert p.comm_busy_ns == 120
    assert p.overlap_efficiency == pytest.approx((120 - 100) / 120)


def test_two_channels_share_the_link() -> None:
    # two 40 ns buckets both ready at 0 on two channels: each at half rate, both end at 80
    p = simulate_step(ready_work_ns=[0, 0], service_ns=[40, 40], num_bytes=[1, 1], num_channels=2)
    assert [(b.start_ns, b.end_ns) for b in p.buckets] == [(0, 80), (0, 80)]
    # the makespan equals one channel's (work conserving); only per-bucket times differ
    one = simulate_step(ready_work_ns=[0, 0], service_ns=[40, 40], num_bytes=[1, 1])
    assert max(b.end_ns for b in one.buckets) == 80


def test_launch_order_is_kept() -> None:
    # bucket 1's gradients are ready before bucket 0's: DDP still hands 0 over first
    p = simulate_step(ready_work_ns=[50, 10], service_ns=[5, 5], num_bytes=[1, 1])
    assert p.buckets[1].ready_ns == p.buckets[0].ready_ns == 50
    assert p.buckets[1].start_ns == 55


def test_interference_factor_arithmetic() -> None:
    # comm 2x slower under compute, compute 1.5x slower under comm; a 10 ns all-reduce from 0
    # of 100 ns of compute: it takes 20 ns, during which compute does 20 / 1.5 of work
    p = simulate_step(
        ready_work_ns=[0], service_ns=[10], num_bytes=[1], compute_work_ns=100,
        interference=_flat(2.0, 1.5),
    )  # fmt: skip
    assert p.buckets[0].end_ns == pytest.approx(20)
    assert p.compute_end_ns == pytest.approx(20 + (100 - 20 / 1.5))
    assert p.exposed_ns == pytest.approx(20)  # one bucket: all of it after the last hook entry


def test_comm_runs_at_idle_speed_once_compute_ends() -> None:
    # a 30 ns all-reduce starting at 90 of 100: 10 ns at half speed (5 ns of its work), then
    # the remaining 25 ns alone: ends at 125, all 35 after its hook entry exposed
    p = simulate_step(
        ready_work_ns=[90], service_ns=[30], num_bytes=[1], compute_work_ns=100,
        interference=_flat(2.0, 1.0),
    )  # fmt: skip
    assert p.buckets[0].end_ns == pytest.approx(125)
    assert p.exposed_ns == pytest.approx(125 - 90)


def test_hook_time_delays_compute_and_hand_over() -> None:
    # each hook costs 5 ns of the training thread: bucket 1 is entered at 20 + 5, handed over
    # at 20 + 10, and compute ends 10 ns later than without hooks
    p = simulate_step(
        ready_work_ns=[10, 20], service_ns=[1, 1], num_bytes=[1, 1], launch_overhead_ns=5
    )
    assert p.buckets[1].ready_ns == 25 and p.buckets[1].start_ns == 30
    assert p.compute_end_ns == 30
    # compute that goes on after the last hook: 50 of work plus both hooks' 10
    more = simulate_step(
        ready_work_ns=[10, 20], service_ns=[1, 1], num_bytes=[1, 1], launch_overhead_ns=5,
        compute_work_ns=50,
    )  # fmt: skip
    assert more.compute_end_ns == 50 + 2 * 5


def test_no_communication() -> None:
    p = simulate_step(ready_work_ns=[], service_ns=[], num_bytes=[], compute_work_ns=40)
    assert p.step_ns == 40 and p.exposed_ns == 0 and math.isnan(p.overlap_efficiency)
    assert p.to_dict()["overlap_efficiency"] is None


def test_interference_interpolates_in_log_size() -> None:
    i = Interference(
        sizes_bytes=(1024.0, 4096.0), comm_slowdown=(1.0, 3.0), compute_slowdown=(1.0, 1.0)
    )
    assert i.comm_factor(2048) == pytest.approx(2.0)  # halfway in log2
    assert i.comm_factor(10) == 1.0 and i.comm_factor(1 << 30) == 3.0  # clamped
    assert NO_INTERFERENCE.comm_factor(123) == 1.0


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="one entry per bucket"):
        simulate_step(ready_work_ns=[1], service_ns=[], num_bytes=[])
    with pytest.raises(ValueError, match="num_channels"):
        simulate_step(ready_work_ns=[1], service_ns=[1], num_bytes=[1], num_channels=0)
    with pytest.raises(ValueError, match="compute_work_ns"):
        simulate_step(ready_work_ns=[10], service_ns=[1], num_bytes=[1], compute_work_ns=5)
    with pytest.raises(ValueError, match="comm_slowdown"):
        Interference(sizes_bytes=(1.0,), comm_slowdown=(0.0,), compute_slowdown=(1.0,))
