"""bench/engine_time.py: its bookkeeping (pool files, commit waves, ratios to DS, the JSON
schema the issue names) on made-up rounds, and a CI-size run on the real vLLM engine."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from tests._need import need

from .test_allocation_bench import BENCH, _load

bench = _load("bench_engine_time", "engine_time.py")   # puts bench/ on sys.path
report = _load("_engine_time_report", "_engine_time_report.py")
pools = _load("_pools", "_pools.py")

SCHEMA = ("effective_groups_per_engine_s", "effective_groups_per_token",
          "rollouts_per_effective_group", "wasted_tokens_at_abort", "engine_occupancy",
          "prefix_cache_hit_rate")


def gen(group, started, finished, tokens=10, reason="stop", prompt=150, cached=0):
    return bench.GenRecord(group, started, finished, tokens, reason, prompt, cached)


def test_commit_waves_are_rollouts_started_after_a_sibling_finished():
    records = [gen("a", 0, 1, cached=0), gen("a", 0, 2, cached=0),          # probes
               gen("a", 1.5, 3, cached=128), gen("a", 1.5, 3, cached=0),    # commit wave
               gen("b", 0, 1, cached=128)]                                   # b: no wave
    figures = report.cache_figures(records)
    assert figures["commit_wave_rollouts"] == 2
    assert figures["prefix_cache_hit_rate"] == pytest.approx(128 / 300)
    assert figures["prefix_cache_hit_rate_all"] == pytest.approx(256 / 750)
    assert report.cache_figures([gen("c", 0, 1)])["prefix_cache_hit_rate"] is None


def test_a_groups_age_counts_the_batches_that_arrived_while_it_was_in_the_making():
    """a starts at 0 and arrives in the third batch, after two that arrived since: age 2 (over
    max_staleness 1); b starts before the first batch arrives: age 1; c is in the first batch: age 0;
    d's rollouts ran in an earlier round (no record): left out."""
    records = [gen("a", 0.0, 1.0), gen("a", 2.5, 4.0), gen("b", 0.5, 2.0), gen("c", 0.2, 0.5)]
    r = bench.PolicyRound("sara", 3, 5.0, 5.0, records, {}, 1.0, [1.0],
                          batches=[(1.0, ["c", "d"]), (2.0, ["b"]), (4.5, ["a"])])
    ages = report.age_figures(r)
    assert ages["batches_in_flight"] == pytest.approx((0 + 1 + 2) / 3)
    assert ages["stale_share_at_1"] == pytest.approx(1 / 3) and ages["stale_share_at_2"] == 0
    assert report.age_figures(bench.PolicyRound("ds", 0, 1.0, 1.0, [], {}, 1.0, [])) == {
        "batches_in_flight": None, "stale_share_at_1": None, "stale_share_at_2": None}


def _round(policy, effective, seconds, gens, aborted=0, t0=100.0):
    records = [gen(f"g{i // 8}", t0, t0 + seconds * (i + 1) / gens, tokens=20)
               for i in range(gens)]
    records += [gen("late", t0, t0 + seconds + 5)]                # after the clock stopped
    for r in records[:aborted]:
        r.finish_reason = "abort"
    return bench.PolicyRound(policy, effective, seconds, seconds + 5, records,
                             {"worker": 0.5, "scheduler": 0.1, "engine-waiting": 0.3},
                             0.9, [0.9], t0=t0)


def test_figures_and_ratios_per_round_against_ds():
    rounds = [_round("ds", 10, 4.0, 400), _round("sara", 10, 3.0, 320, aborted=5),
              _round("ds", 10, 5.0, 400), _round("sara", 10, 4.0, 320, aborted=5)]
    summary = report.summarise(rounds, ["ds", "sara"], {"ds": 40.0, "sara": 33.0})
    sara = summary["sara"]
    assert sara["rollouts_per_effective_group"] == pytest.approx(32.0)   # late one left out
    assert sara["wasted_tokens_at_abort"] == pytest.approx(100.0)
    assert sara["effective_groups_per_engine_s"] == pytest.approx((10 / 3 + 10 / 4) / 2)
    assert sara["allocation_gain_vs_ds"] == pytest.approx(40 / 32)
    engine = [(10 / 3) / (10 / 4), (10 / 4) / (10 / 5)]
    assert sara["engine_gain_vs_ds"] == pytest.approx(sum(engine) / 2)
    assert sara["saving_kept"] == pytest.approx(sum(e / 1.25 for e in engine) / 2)
    assert sara["exact_rollouts_per_effective_group"] == 33.0
    # CPU: (worker + scheduler) cores x the whole round, per generation
    assert sara["cpu_ms_per_rollout"] == pytest.approx(
        (1000 * 0.6 * 8 / 321 + 1000 * 0.6 * 9 / 321) / 2)


def test_json_has_the_issue_schema_and_the_text_names_the_checks(tmp_path):
    rounds = [_round("raw", 0, 2.0, 256), _round("ds", 10, 4.0, 400),
              _round("sara", 10, 3.0, 320)]
    args = bench.parse_args(["--policies", "ds,sara", "--out", str(tmp_path / "e.txt")])
    bench_cmd = "python bench/engine_time.py --policies ds,sara"
    report.write_outputs(args, rounds, {"ds": 40.0, "sara": 33.0}, bench_cmd, "0.1", None)
    result = json.loads((tmp_path / "e.json").read_text())
    assert set(result["policies"]) == {"ds", "sara"}
    for entry in result["policies"].values():
        assert all(key in entry for key in SCHEMA)
    assert isinstance(result["cpu_ms_added_per_rollout"], float)
    text = (tmp_path / "e.txt").read_text()
    assert "saving kept" in text and "sara:" in text and bench_cmd in text


def test_exact_figures_are_the_allocation_bench_closed_form():
    pool = bench.standard_prompts(64, seed=3)
    gammas = [p["meta"]["p_success"] for p in pool]
    assert bench.exact_rollouts_per_effective(pool, 8, "ds") == pytest.approx(
        pools.expectation(gammas, 8, "dynamic_sampling").rollouts_per_effective)
    assert bench.exact_rollouts_per_effective(pool, 8, "sara_auto") is None
    assert all(len(p["prompt"]) >= 128 for p in pool)   # one full KV block on the CPU engine


def test_a_pool_file_needs_meta_p_success(tmp_path):
    good = tmp_path / "pool.jsonl"
    good.write_text(json.dumps({"id": "a", "prompt": "x", "meta": {"p_success": 0.5}}) + "\n\n")
    assert [p["task"] for p in bench.load_prompts(good)] == ["sim"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "meta": {"p_success": 1.5}}) + "\n")
    with pytest.raises(SystemExit, match="bad.jsonl:1: .*meta.p_success"):
        bench.load_prompts(bad)


def test_unknown_policies_are_refused():
    with pytest.raises(SystemExit):
        bench.parse_args(["--policies", "ds,greedy"])
    args = bench.parse_args(["--quick", "--no-write"])
    assert args.json is None and args.effective_groups == 16
    assert isinstance(args, argparse.Namespace)


def test_a_run_that_names_its_json_leaves_the_recording_alone(tmp_path):
    args = bench.parse_args(["--policies", "ds,sara", "--json", str(tmp_path / "r.json")])
    assert args.out == tmp_path / "r.txt"            # the text and chart go beside the JSON
    args = bench.parse_args([])
    assert args.out == bench.RESULTS / "engine_time.txt" and args.json == args.out.with_suffix(
        ".json")
    args = bench.parse_args(["--out", str(tmp_path / "e.txt")])
    assert args.json == tmp_path / "e.json"


def test_the_worker_holds_what_sara_worker_would_fit_to_the_engine_unless_told():
    assert bench.parse_args(["--no-write"]).capacity == 96            # 64 slots + 32 ahead
    assert bench.parse_args(["--no-write", "--concurrency", "128"]).capacity == 192
    assert bench.parse_args(["--no-write", "--capacity", "128"]).capacity == 128


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_on_the_real_engine(tmp_path):
    need("vllm", "the engine-time bench runs the real vLLM engine")
    out = tmp_path / "engine_time.json"
    done = subprocess.run([sys.executable, str(BENCH / "engine_time.py"), "--quick",
                           "--policies", "ds,sara", "--no-write", "--json", str(out)],
                          capture_output=True, text=True, timeout=580,
                          env={**__import__("os").environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    for policy in ("ds", "sara"):
        entry = result["policies"][policy]
        assert all(entry[key] is not None for key in SCHEMA if key != "prefix_cache_hit_rate")
        assert entry["rounds"] == 2 and 0 < entry["engine_occupancy"] <= 1
        # 2 x 16 effective groups: loose bounds around the exact 40 / 33 rollouts per group
        assert 0.5 * entry["exact_rollouts_per_effective_group"] \
            < entry["rollouts_per_effective_group"] \
            < 1.6 * entry["exact_rollouts_per_effective_group"]
    assert result["policies"]["sara"]["prefix_cache_hit_rate"] > 0.3   # commit waves hit
    assert result["raw_engine"]["rollouts_per_s"] > 0


def test_the_mostly_mixed_pool_is_its_generators_and_engine_time_reads_it():
    module = _load("mostly_mixed", "pools/mostly_mixed.py")
    path = BENCH / "pools" / "mostly_mixed.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == module.prompts()
    pool = bench.load_prompts(path)
    assert len(pool) == 512 and all(len(p["prompt"]) == 150 for p in pool)
    gammas = [p["meta"]["p_success"] for p in pool]
    assert gammas.count(0.0) == 76 and gammas.count(1.0) == 51
