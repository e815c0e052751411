"""`sara stats --watch`: the pure render(stats, previous, dt), the watch loop and the CLI flags."""

from __future__ import annotations

import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sara_client.models import StatsResponse
from sara_cli import common
from sara_cli import main as cli
from sara_cli import watch as watch_mod
from sara_cli.watch import decision_rates, render, saving_vs_ds, watch

NOW = 1_700_000_100.0


def make_stats(now: float = NOW, commit: int = 40, abandon: int = 90, cont: int = 300,
               **overrides) -> StatsResponse:
    data = {
        "namespace": "run7", "now": now, "policy": {"version": 3, "checkpoint": "ckpt-3"},
        "config": {"policy": "sara", "selection": "epoch", "group_size": 8, "tau_low": 0.5,
                   "auth_enabled": True},
        "counters": {"rollouts_issued": 5000, "rollouts_completed": 4800,
                     "rollouts_not_spent_on_abandoned_groups": 1234, "groups_delivered": 300,
                     "audits_mixed": 4, "audits_pure": 16,
                     "groups_committed": 310, "groups_abandoned": 420, "batches_formed": 37,
                     "decisions_commit": commit, "decisions_abandon": abandon,
                     "decisions_continue": cont, "expected_false_abandons": 12.5},
        "derived": {"rollouts_in_flight": 200, "useful_fraction": 0.5,
                    "rollouts_per_effective_group": 16.0,
                    "ds_rollouts_per_effective_group": 20.0,
                    "ds_rollouts_per_effective_group_low": 18.0,
                    "ds_rollouts_per_effective_group_high": 23.0,
                    "net_saving_vs_ds": 0.2, "net_saving_vs_ds_low": 0.11,
                    "net_saving_vs_ds_high": 0.3, "net_rollouts_saved_vs_ds": 1200.0,
                    "false_abandon_rate": 0.2, "false_abandon_rate_low": 0.08,
                    "false_abandon_rate_high": 0.42, "audit_cost_fraction": 0.021,
                    "abandon_rate": 0.575, "expected_false_abandon_rate": 0.0297},
        "queues": {"pending": 17, "leased": 183, "open_groups": 29, "expected_yield_open": 6.5,
                   "ready_groups": 11, "unacked_batches": 2, "flow_target": 64},
        "abandon_histogram": {"3": 5, "4": 400, "5": 15},
        "workers": [
            {"worker_id": "gpu-0", "backend": "vllm", "policy_version": 3, "last_seen": now - 1,
             "stale": False, "rollouts_completed": 2400, "tokens_generated": 480000,
             "leases": 90, "rollouts_per_s": 41.5, "tokens_per_s": 8300.0},
            {"worker_id": "gpu-9", "backend": "hf", "policy_version": 1, "last_seen": now - 600,
             "stale": True, "rollouts_completed": 12, "tokens_generated": 900},
        ],
        "recent_batches": [
            {"batch_id": "b-newest", "created_at": now - 3, "policy_version": 3, "groups": 32,
             "rollouts": 256, "stats": {"rollouts_spent": 410, "groups_abandoned": 20,
                                        "rollouts_not_spent_on_abandoned_groups": 90,
                                        "ended_early": True}},
            {"batch_id": "b-older", "created_at": now - 40, "policy_version": 2, "groups": 32,
             "rollouts": 256, "stats": {"rollouts_spent": 390, "groups_abandoned": 18,
                                        "rollouts_not_spent_on_abandoned_groups": 80,
                                        "ended_early": False}},
        ],
    }
    data.update(overrides)
    return StatsResponse.model_validate(data)


def rate(out: str, decision: str) -> str:
    """The per-second figure shown for a decision (the cell after its name)."""
    match = re.search(rf"\b{decision}\s+(\S+)\s+[\d,]+\s", out)
    assert match, (decision, out)
    return match.group(1)


def text_of(renderable, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    console.print(renderable)
    return console.export_text()


def test_render_shows_every_section_from_stats_and_deltas():
    previous = make_stats(now=NOW - 2, commit=30, abandon=80, cont=200)
    out = text_of(render(make_stats(), previous, 2.0))
    # header and verdict
    assert "ns=run7" in out and "policy v3" in out and "k=8" in out and "auth on" in out
    assert "saving 20.0% of rollouts vs Dynamic Sampling" in out
    assert "ESTIMATE, 95% CI 11.0%–30.0%" in out
    # efficiency against DS: every DS figure with its interval, the unspent count named as such
    assert "16.00" in out and "DS 20.00 (95% CI 18.00–23.00)" in out and "57.5%" in out
    assert "1,234" in next(line for line in out.splitlines() if "not spent on abandoned" in line)
    assert "20 audited, 95% CI 8.0%–42.0%" in out and "2.1%" in out
    assert "DS 40.0%" in out  # DS useful fraction: k / DS cost = 8 / 20
    # decisions per second from the counter deltas over dt: 10/2, 10/2, 100/2
    assert rate(out, "commit") == "5.0" and rate(out, "abandon") == "5.0"
    assert rate(out, "continue") == "50.0"
    # histogram as bars, scaled to the largest bucket
    bar_lines = [line for line in out.splitlines() if "█" in line]
    assert len(bar_lines) == 3
    longest = max(bar_lines, key=lambda line: line.count("█"))
    assert longest.count("█") == watch_mod.BAR_WIDTH and longest.rstrip().endswith("400")
    # queues
    for label, value in (("pending", "17"), ("leased", "183"), ("open groups", "29"),
                         ("ready groups", "11"), ("unacked batches", "2"), ("in flight", "200")):
        assert any(label in line and value in line.split() for line in out.splitlines()), label
    # workers: stale flagged, rates, the one behind the current policy
    assert "workers (1 live, 1 stale)" in out
    gpu0 = next(line for line in out.splitlines() if "gpu-0" in line)
    assert "vllm" in gpu0 and "41.5" in gpu0 and "8,300" in gpu0 and "live" in gpu0
    gpu9 = next(line for line in out.splitlines() if "gpu-9" in line)
    assert "STALE" in gpu9 and "v1" in gpu9 and "10 min" in gpu9
    # recent batches, newest first
    assert out.index("b-newest") < out.index("b-older")
    newest = next(line for line in out.splitlines() if "b-newest" in line)
    assert "410" in newest and "90" in newest and "early" in newest and "3.0 s" in newest


def test_render_without_previous_has_no_rates_and_uses_now_when_dt_is_missing():
    out = text_of(render(make_stats()))
    assert rate(out, "commit") == "-" and rate(out, "continue") == "-"
    prev = make_stats(now=NOW - 4, commit=20)
    assert decision_rates(make_stats().model_dump(), prev.model_dump(), None)["commit"] == 5.0


def test_rates_are_none_after_a_counter_reset_or_without_time():
    stats, prev = make_stats(commit=1).model_dump(), make_stats(commit=50).model_dump()
    assert decision_rates(stats, prev, 1.0) == {"commit": None, "abandon": None,
                                                "continue": None}
    assert decision_rates(stats, stats, 0.0)["commit"] is None


def test_render_when_not_saving_and_on_a_fresh_namespace():
    worse = make_stats(derived={"rollouts_in_flight": 0, "useful_fraction": 0.3,
                                "rollouts_per_effective_group": 25.0,
                                "ds_rollouts_per_effective_group": 20.0, "abandon_rate": 0.1,
                                "net_saving_vs_ds": -0.25, "net_saving_vs_ds_low": -0.4,
                                "net_saving_vs_ds_high": -0.1,
                                "expected_false_abandon_rate": None})
    assert saving_vs_ds(worse.model_dump()) == (-0.25, -0.4, -0.1)
    assert "spending 25.0% more rollouts than Dynamic Sampling" in text_of(render(worse))
    # an interval that straddles zero is not called a saving, whatever the point says
    unsure = make_stats(derived={**worse.derived.model_dump(), "net_saving_vs_ds": 0.05,
                                 "net_saving_vs_ds_low": -0.05, "net_saving_vs_ds_high": 0.15})
    assert "5.0% vs Dynamic Sampling, within noise" in text_of(render(unsure))
    fresh = {"namespace": "default", "now": NOW, "config": {}, "counters": {}, "derived": {},
             "queues": {}, "policy": {"version": 0}}
    out = text_of(render(fresh, fresh, 1.0))
    assert "no estimate yet" in out
    assert "no group abandoned yet" in out and "no worker has leased yet" in out
    assert "no batch formed yet" in out


def test_render_accepts_a_partial_dict():  # what a foreign or older /stats might answer
    out = text_of(render({"namespace": "x", "counters": {"rollouts_issued": 3},
                          "workers": [{"worker_id": "w1", "stale": False}]}))
    assert "w1" in out and "ns=x" in out


def test_render_shows_the_runs_warnings():
    said = "rewards are not 0/1 (first seen: 0.1): ... SARA_EFFECTIVE=reward ..."
    out = text_of(render(make_stats(warnings=[said])), width=400)
    assert "warning: " + said in out
    assert "warning" not in text_of(render(make_stats()))


def test_watch_polls_until_max_frames_and_survives_errors():
    answers = [make_stats(now=NOW, commit=10), RuntimeError("connection refused"),
               make_stats(now=NOW + 1, commit=30)]
    sleeps: list[float] = []
    ticks = iter([0.0, 0.1, 1.0, 1.1, 2.0, 2.1])

    def fetch():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    # a terminal: every frame is drawn (and recorded)
    console = Console(record=True, width=160, height=300, color_system=None, force_terminal=True)
    frames = watch(fetch, 1.0, console, max_frames=3, sleep=sleeps.append,
                   clock=lambda: next(ticks))
    assert frames == 3 and answers == []
    assert sleeps == [pytest.approx(0.9), pytest.approx(0.9)]  # none after the last frame
    out = console.export_text(styles=False)
    # frame 1 | frame 2: the error above frame 1 again | frame 3 (and its final print)
    chunks = out.split("SARA ns=run7")[1:]
    assert rate(chunks[0], "commit") == "-"
    assert "stats failed: connection refused" in chunks[0]  # the panel heads frame 2
    assert rate(chunks[1], "commit") == "-"
    # the third frame's rates use the two good answers, 2 s apart on the watch clock
    assert "stats failed" not in chunks[2]
    assert rate(chunks[2], "commit") == "10.0" and rate(chunks[2], "abandon") == "0.0"


def test_watch_quits_quietly_on_ctrl_c():
    def fetch():
        raise KeyboardInterrupt

    console = Console(record=True, width=120, color_system=None, force_terminal=False)
    assert watch(fetch, 1.0, console, sleep=lambda s: None) == 0


# --- the CLI -------------------------------------------------------------------------------------

runner = CliRunner()


class FakeClient:
    def __init__(self, url, token=None):
        self.url, self.token, self.closed, self.calls = url, token, False, 0

    def stats(self):
        self.calls += 1
        return make_stats(now=NOW + self.calls, commit=10 * self.calls)

    def close(self):
        self.closed = True


def test_cli_stats_watch_uses_interval_and_renders_live(monkeypatch):
    clients: list[FakeClient] = []
    seen: dict = {}

    def fake_client(url, token):
        clients.append(FakeClient(url, token))
        return clients[-1]

    real_watch = watch_mod.watch

    def bounded_watch(fetch, interval, console=None, **kw):
        seen["interval"] = interval
        return real_watch(fetch, interval, console, max_frames=2, sleep=lambda s: None)

    monkeypatch.setattr(common, "client", fake_client)
    monkeypatch.setattr(watch_mod, "watch", bounded_watch)
    result = runner.invoke(cli.app, ["stats", "--watch", "--interval", "0.5", "--url",
                                     "http://sched:1", "--token", "op"])
    assert result.exit_code == 0, result.output
    assert seen["interval"] == 0.5
    (client,) = clients
    assert (client.url, client.token, client.calls, client.closed) == ("http://sched:1", "op", 2,
                                                                       True)
    assert "saving 20.0% of rollouts vs Dynamic Sampling" in result.output
    assert "gpu-0" in result.output and "b-newest" in result.output


def test_cli_stats_watch_flag_errors(monkeypatch):
    monkeypatch.setattr(common, "client", FakeClient)
    result = runner.invoke(cli.app, ["stats", "--watch", "--json"])
    assert result.exit_code == 2 and "do not go together" in result.output
    result = runner.invoke(cli.app, ["stats", "--watch", "--interval", "0"])
    assert result.exit_code == 2
    help_text = runner.invoke(cli.app, ["stats", "--help"]).output
    assert "--watch" in help_text and "--interval" in help_text
