"""The demo's RL wiring that a run's speed depends on."""

from __future__ import annotations

from tests._need import need

need("torch", "torch (the trainer extra; CI installs it)")

import dataclasses

from sara_demo.config import DemoConfig
from sara_demo.rl import worker_capacity


def test_the_worker_holds_every_rollout_the_scheduler_keeps_in_the_making():
    cfg = DemoConfig(batch_groups=16, group_size=8)
    assert worker_capacity(dataclasses.replace(cfg, prefetch_batches=4)) == 16 * 8 * 4
    # at least two batches' worth: what the demo and the recordings before it ran with
    assert worker_capacity(dataclasses.replace(cfg, prefetch_batches=1)) == 16 * 8 * 2
    assert worker_capacity(dataclasses.replace(cfg, prefetch_batches=2)) == 16 * 8 * 2
