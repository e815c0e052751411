"""`sara consume` against the real scheduler in this process (sara_client.local(): the app and
its Lua scripts on an embedded Redis): it pulls and acks batches, printing one line each, stops
after --batches or at Ctrl-C with a summary, and exits 1 naming what holds the run up when no
batch comes within --wait-s."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import sara_client
from sara_cli import common
from sara_cli import main as cli

runner = CliRunner()
BATCH_LINE = re.compile(r"^batch b\S+: 2 groups, 4 rollouts, policy v0, mean reward 0\.500$")


class Borrowed:
    """The in-process client, lent to the command: it must not close it."""

    def __init__(self, client, interrupt_after: int | None = None) -> None:
        self.client, self.interrupt_after, self.waits = client, interrupt_after, 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def wait_for_batch(self, **kw):
        self.waits += 1
        if self.interrupt_after is not None and self.waits > self.interrupt_after:
            raise KeyboardInterrupt   # Ctrl-C while it waits
        return self.client.wait_for_batch(**kw)

    def close(self) -> None:
        pass


@pytest.fixture
def sara(tmp_path):
    with sara_client.local(data_dir=tmp_path, policy="uniform", group_size=2, batch_size=2,
                           prefetch_batches=2) as client:
        yield client


def _lend(monkeypatch, client, interrupt_after=None) -> None:
    monkeypatch.setattr(common, "client",
                        lambda url, token: Borrowed(client, interrupt_after))


def _fill(sara) -> None:
    """Eight prompts and one worker's results (slot 0 fails, slot 1 succeeds) until flow
    control is full: two batches ready."""
    sara.add_prompts([{"id": f"p{i}", "prompt": f"q{i}", "answer": "1"} for i in range(8)])
    while (lease := sara.lease("w1", 64)).rollouts:
        sara.report("w1", [{"rollout_id": r.rollout_id, "reward": float(r.rollout_id[-1] == "1")}
                           for r in lease.rollouts])


def test_it_acks_the_batches_asked_for_with_a_line_each(sara, monkeypatch):
    _fill(sara)
    _lend(monkeypatch, sara)
    result = runner.invoke(cli.app, ["consume", "--batches", "2", "--wait-s", "5"])
    assert result.exit_code == 0, result.output
    *batches, summary = result.output.splitlines()
    assert len(batches) == 2 and all(BATCH_LINE.match(line) for line in batches), batches
    assert summary == "sara consume: 2 batches acked, 4 groups, 8 rollouts"
    assert sara.stats().counters.batches_acked == 2


def test_ctrl_c_exits_0_with_the_summary(sara, monkeypatch):
    _fill(sara)
    _lend(monkeypatch, sara, interrupt_after=1)
    result = runner.invoke(cli.app, ["consume"])   # --batches 0: until interrupted
    assert result.exit_code == 0, result.output
    first, summary = result.output.splitlines()
    assert BATCH_LINE.match(first)
    assert summary == "sara consume: 1 batches acked, 2 groups, 4 rollouts"


def test_no_batch_within_wait_s_exits_1_saying_why(sara, monkeypatch):
    _lend(monkeypatch, sara)
    result = runner.invoke(cli.app, ["consume", "--wait-s", "0.2"])
    assert result.exit_code == 1
    assert "no batch within 0.2 s" in result.output and "the run is running" in result.output
    assert result.output.splitlines()[-1] == "sara consume: 0 batches acked, 0 groups, 0 rollouts"
