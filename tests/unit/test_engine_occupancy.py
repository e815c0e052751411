"""The worker's engine occupancy (sara_worker.occupancy): the time-weighted share of its slots
generating between two leases, on an injected clock."""

from __future__ import annotations

import pytest

from sara_worker.occupancy import EngineOccupancy
from tests.conftest import FakeClock


def test_occupancy_is_the_time_weighted_share_of_slots_in_use():
    clock = FakeClock(0.0)
    meter = EngineOccupancy(slots=4, clock=clock)
    meter.generating(4)          # full for 1 s
    clock.advance(1.0)
    meter.generating(2)          # half for 2 s
    clock.advance(2.0)
    meter.generating(0)          # idle for 1 s
    clock.advance(1.0)
    load = meter.take()
    assert load.slots == 4 and load.occupancy == pytest.approx((4 * 1 + 2 * 2) / (4 * 4))
    # the next interval starts where the last ended, idle so far
    clock.advance(1.0)
    assert meter.take().occupancy == 0.0


def test_rollouts_beyond_the_slots_count_as_full_and_no_time_gives_no_figure():
    clock = FakeClock(10.0)
    meter = EngineOccupancy(slots=2, clock=clock)
    assert meter.take() is None          # no time has passed
    meter.generating(7)                  # queued in the engine beyond its slots
    clock.advance(3.0)
    assert meter.take().occupancy == 1.0
    with pytest.raises(ValueError, match="slots"):
        EngineOccupancy(slots=0, clock=clock)
