"""`sara prompts ...` and `sara run ...`: arguments reach the SDK, answers print one per line,
failures are one line on stderr and exit 1."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import sara_client
from sara_client import NotFoundError
from sara_client.models import (Posterior, PromptHistory, PromptStateResponse, PromptSummary,
                                RunStatus)
from sara_cli import main as cli

runner = CliRunner()


class FakeClient:
    calls: list = []

    def __init__(self, url, token=None):
        self.url, self.token = url, token

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def iter_prompts(self, page_size=100):
        self.calls.append(("iter", page_size))
        for i in range(3):
            yield PromptSummary(id=f"p{i}", prompt="q", task="exact", state="enabled",
                                posterior=Posterior(alpha=1, beta=3, version=0),
                                history=PromptHistory(groups=i))

    def set_prompt_enabled(self, pid, enabled):
        self.calls.append(("enabled", pid, enabled))
        if pid == "missing":
            raise NotFoundError("no prompt with id 'missing'", status_code=404)
        return PromptStateResponse(id=pid, state="enabled" if enabled else "disabled")

    def delete_prompt(self, pid):
        self.calls.append(("delete", pid))
        return PromptStateResponse(id=pid, state="deleted")

    def control_run(self, action):
        self.calls.append(("run", action, self.url, self.token))
        return RunStatus(namespace="ns", state={"pause": "paused", "resume": "running",
                                                "drain": "draining"}[action])

    def run_status(self):
        return RunStatus(namespace="ns", state="drained")


@pytest.fixture(autouse=True)
def fake(monkeypatch):
    FakeClient.calls = []
    monkeypatch.setattr(sara_client, "SaraClient", FakeClient)
    return FakeClient


def test_prompts_list_prints_state_and_posterior_mean():
    out = runner.invoke(cli.app, ["prompts", "list", "--limit", "2"])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("p0\tenabled\tp=0.250")


def test_prompts_list_with_its_documented_default_lists_them_all():
    out = runner.invoke(cli.app, ["prompts", "list"])   # --limit 0: all
    assert out.exit_code == 0, out.output
    assert [line.split("\t")[0] for line in out.output.splitlines()] == ["p0", "p1", "p2"]


def test_prompts_disable_enable_delete_take_several_ids():
    assert runner.invoke(cli.app, ["prompts", "disable", "a", "b"]).output == (
        "a\tdisabled\nb\tdisabled\n")
    assert runner.invoke(cli.app, ["prompts", "enable", "a"]).output == "a\tenabled\n"
    assert runner.invoke(cli.app, ["prompts", "delete", "a"]).output == "a\tdeleted\n"
    assert ("delete", "a") in FakeClient.calls


def test_unknown_prompt_is_one_line_and_exit_1():
    out = runner.invoke(cli.app, ["prompts", "disable", "missing"])
    assert out.exit_code == 1 and "disable missing failed" in out.output


@pytest.mark.parametrize("action, state", [("pause", "paused"), ("resume", "running"),
                                           ("drain", "draining"), ("status", "drained")])
def test_run_commands(action, state, monkeypatch):
    monkeypatch.setenv("SARA_TOKEN", "tok")
    out = runner.invoke(cli.app, ["run", action, "--url", "http://x:1"])
    assert out.exit_code == 0, out.output
    assert out.output == f"ns\t{state}\n"
    if action != "status":
        assert FakeClient.calls[-1] == ("run", action, "http://x:1", "tok")


def test_run_status_says_what_holds_the_run_up(monkeypatch):
    waiting = "waiting for a trainer: 64 groups are ready (a batch is 32) ..."
    monkeypatch.setattr(FakeClient, "run_status", lambda self: RunStatus(
        namespace="ns", state="draining", warnings=[waiting]))
    out = runner.invoke(cli.app, ["run", "status"])
    assert out.exit_code == 0
    assert out.stdout == "ns\tdraining\n" and out.stderr == f"warning: {waiting}\n"
