"""bench/allocation.py: its exact expectations against Monte Carlo, its reference scheduler
against the exact figures, and a small run through the real service (SARA below DS at k=16)."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str, file: str):
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pools = _load("_pools", "_pools.py")
bench = _load("bench_allocation", "allocation.py")


# --------------------------------------------------------------- exact math vs Monte Carlo


def monte_carlo(gammas, k, policy, tau, groups, seed):
    """Sample prompts from the pool and run each group one rollout at a time."""
    t_f, t_s = pools.thresholds(k, 1.0, 1.0, tau) if policy == "sara" else (k + 1, k + 1)
    rng = random.Random(seed)
    cost = effective = delivered = abandoned = false = 0
    for _ in range(groups):
        gamma = rng.choice(gammas)
        c, eff, dlv, fa = pools.sample_group(gamma, k, policy, t_f, t_s, rng)
        cost += c
        effective += eff
        delivered += dlv
        false += fa
        abandoned += policy == "sara" and c < k and not eff
    return {"rollouts_per_effective": cost / effective,
            "useful_fraction": k * delivered / cost,
            "false_abandon_rate": false / abandoned if abandoned else None}


@pytest.mark.parametrize("k", [8, 16])
@pytest.mark.parametrize("policy,tau", [("uniform", 0.5), ("dynamic_sampling", 0.5),
                                        ("sara", 0.3), ("sara", 0.45), ("sara", 0.5)])
def test_exact_expectation_matches_monte_carlo(k, policy, tau):
    gammas = pools.make_pool("standard", 400, seed=3).gammas()
    exact = pools.expectation(gammas, k, policy, tau)
    mc = monte_carlo(gammas, k, policy, tau, groups=30_000, seed=k)
    assert mc["rollouts_per_effective"] == pytest.approx(exact.rollouts_per_effective, rel=0.03)
    assert mc["useful_fraction"] == pytest.approx(exact.useful_fraction, rel=0.03)
    if policy == "sara":
        assert mc["false_abandon_rate"] == pytest.approx(exact.false_abandon_rate, abs=0.01)
        assert exact.false_abandon_rate < tau  # the reliability bound, on this pool
    else:
        assert exact.false_abandon_rate is None


def test_drifting_expectation_averages_over_versions():
    pool = pools.make_pool("drifting", 300, seed=1, drift=0.05, versions_per_epoch=4)
    versions = list(range(16))
    exact = pools.expectation([pool.gammas(v) for v in versions], 16, "sara", 0.5)
    # each version delivers the same number of effective groups, as the trainer's batches do
    rng = random.Random(7)
    cost = effective = 0.0
    for v in versions:
        mc = monte_carlo(pool.gammas(v), 16, "sara", 0.5, groups=6000, seed=rng.random())
        cost += mc["rollouts_per_effective"]
        effective += 1
    assert cost / effective == pytest.approx(exact.rollouts_per_effective, rel=0.03)
    assert pool.gamma("p0", 8) == pools.drifted(pool.gamma0["p0"], 0.05, 2.0)


def test_population_figures_match_the_issue():
    """Closed form on the standard pool's population: DS k/P(mixed), SARA ~24% below it."""
    ds = pools.standard_population(16, "dynamic_sampling")
    sara = pools.standard_population(16, "sara", 0.5)
    assert ds == pytest.approx(16 / (0.45 * (1 - 2 * 6 / (18 * 19))), rel=1e-12)
    assert sara == pytest.approx(8 + 8 / (0.45 * (1 - 2 * 6 / (10 * 11))), rel=1e-12)
    assert 0.20 < 1 - sara / ds < 0.25
    big = pools.make_pool("standard", 20_000, seed=0).gammas()
    assert pools.expectation(big, 16, "sara", 0.5).rollouts_per_effective == pytest.approx(
        sara, rel=0.01)


def test_mean_length_matches_the_sim_backend():
    from sara_client.models import Rollout, SamplingParams
    from sara_worker.sim.backend import SimBackend

    sim = SimBackend(seed=5)
    lengths = pools.Lengths.of_sim(max_tokens=256)
    for gamma, expected in ((1.0, lengths.success), (0.0, lengths.failure)):
        total = 0
        for i in range(20_000):
            r = Rollout(rollout_id=f"r{i}", group_id="g", prompt_id="p", prompt="q", task="sim",
                        meta={"p_success": gamma}, sampling=SamplingParams(max_tokens=256))
            total += sim.outcome(r).tokens
        assert total / 20_000 == pytest.approx(expected, rel=0.01)


def _tie(k, a, b, tau):
    """p_eff exactly τ somewhere on a pure prefix: there the rounding decides the service's
    threshold (e.g. k = 11, uniform prior: p_eff after 5 failures is 6/12, computed 0.4999…)."""
    return any(abs(pools.p_eff_pure(a, b, k, n, side) - tau) < 1e-9
               for n in range(k + 1) for side in (True, False))


def test_thresholds_agree_with_the_service_math():
    from sara_service.math.allocation import abandon_thresholds

    rng = random.Random(11)
    cases = [(16, 1.0, 1.0, 0.5), (8, 1.0, 1.0, 0.45), (16, 1.0, 1.0, 0.3)]
    cases += [(rng.randint(2, 40), rng.uniform(0.2, 30), rng.uniform(0.2, 30), rng.random())
              for _ in range(500)]
    cases += [(rng.randint(2, 32), float(rng.randint(1, 20)), float(rng.randint(1, 20)),
               rng.choice([0.3, 0.45, 0.5])) for _ in range(500)]
    # exact ties (p_eff == τ, common with integer posteriors) are "not below τ" here
    assert pools.thresholds(16, 1.0, 2.0, 0.5)[0] == 8    # p_eff(7 failures) = 9/18
    assert pools.thresholds(11, 1.0, 1.0, 0.5) == (6, 6)  # p_eff(5 failures) = 6/12
    for k, a, b, tau in cases:
        if _tie(k, a, b, tau):
            continue
        ref = abandon_thresholds(k, a, b, tau)
        assert pools.thresholds(k, a, b, tau) == (ref.after_failures, ref.after_successes), \
            (k, a, b, tau)


# ------------------------------------------------------------ the reference scheduler (no I/O)


@pytest.mark.parametrize("method", ["ds", "sara-0.5", "uniform"])
def test_reference_model_matches_exact(method):
    cfg = bench.Config(pool="standard", k=16, groups=1536, prompts=512, model_reps=0)
    out = bench.run_job(bench.Job(cfg, method, "model", rep=1))
    exact = bench.exact_expectation(cfg, bench.METHODS[method])
    if method == "uniform":  # stale drops (flow control weighs uniform groups at p_eff)
        assert out["rollouts_per_effective"] >= exact["rollouts_per_effective"] * 0.95
        return
    assert out["rollouts_per_effective"] == pytest.approx(exact["rollouts_per_effective"],
                                                          rel=0.06)
    assert out["useful_fraction"] == pytest.approx(exact["useful_fraction"], rel=0.06)
    assert out["n_violations"] == 0


# ----------------------------------------------------------------- through the real service


def test_small_run_through_the_service(tmp_path):
    """The product's claim at small scale: SARA needs fewer rollouts per effective group than
    DS on the standard pool at k=16; and the reference scheduler, on the same seeds, makes the
    very same decisions as the service's Lua scripts."""
    prefix = tmp_path / "alloc"
    code = bench.main(["--pool", "standard", "--k", "16", "--methods", "ds,sara-0.5",
                       "--groups", "256", "--prompts", "256", "--model-reps", "1",
                       "--no-progress", "--out", str(prefix)])
    assert code == 0
    text = prefix.with_suffix(".txt").read_text()
    assert "standard pool, k=16" in text and "SARA τ=0.5" in text
    rows = {r["method"]: r for r in json.loads(prefix.with_suffix(".json").read_text())["results"]}
    ds, sara = rows["ds"]["measured"], rows["sara-0.5"]["measured"]
    assert sara["rollouts_per_effective"] < ds["rollouts_per_effective"]
    for row in rows.values():
        m = row["measured"]
        assert m["n_violations"] == 0, m["violations"]
        assert row["model"]["same_as_service"], row["method"]
        assert m["rollouts_per_effective"] == pytest.approx(
            row["exact"]["rollouts_per_effective"], rel=0.15)
        assert m["counters"]["groups_dropped_stale"] == 0
    assert {int(n): c for n, c in sara["counters"]["abandon_histogram"].items()} == {
        int(n): c for n, c in sara["abandon_hist"].items()}
    assert sara["false_abandon_rate"] < 0.5


def test_the_useful_fraction_is_a_fraction_and_uniform_wastes_nothing(tmp_path):
    """`sara bench`'s quick configuration: the batches of the first round that delivered any
    are outside the window (their groups were paid for before it), so uniform, which delivers
    every group it opens, measures exactly 1 and no method more than 1."""
    prefix = tmp_path / "useful"
    code = bench.main(["--pool", "standard", "--k", "16", "--methods", "uniform,ds",
                       "--groups", "256", "--prompts", "256", "--model-reps", "1",
                       "--no-progress", "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r for r in json.loads(prefix.with_suffix(".json").read_text())["results"]}
    assert rows["uniform"]["measured"]["useful_fraction"] == 1.0
    for row in rows.values():
        assert 0 < row["measured"]["useful_fraction"] <= 1, row["method"]
        assert all(0 < r["useful_fraction"] <= 1 for r in row["model"]["runs"])
    text = prefix.with_suffix(".txt").read_text()
    assert "model = mean of 1 independent run of the reference scheduler; '=' = one more run" \
        in text


def test_progress_names_the_runs_the_table_counts():
    (cfg,) = bench.configs(bench.parse_args(["--quick"]))
    names = [job.name for job in bench._jobs([cfg], ["ds"])]
    assert sorted(names) == ["standard k=16 DS", "standard k=16 DS model 1/1",
                             "standard k=16 DS model, service's seeds"]


def test_history_memory_in_epochs_is_mirrored_by_the_reference_model(tmp_path):
    """The half-life runs on the pool's clock in apply_results.lua, the scheduler and the
    reference model alike: at a half-life of a fraction of an epoch (weights that are not powers
    of two) and under the old per-version rule, both make the very same decisions."""
    prefix = tmp_path / "memory"
    code = bench.main(["--pool", "drifting", "--k", "8", "--methods",
                       "ds,sara-history,sara-history-v0.5", "--groups", "256", "--prompts", "128",
                       "--model-reps", "0", "--posterior-half-life", "0.7", "--no-progress",
                       "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r for r in json.loads(prefix.with_suffix(".json").read_text())["results"]}
    for row in rows.values():
        assert row["measured"]["n_violations"] == 0
        assert row["model"]["same_as_service"], row["method"]
    assert rows["sara-history"]["settings"]["posterior_half_life"] == 0.7
    assert rows["sara-history-v0.5"]["settings"]["posterior_decay"] == 0.5


def test_audit_sampling_is_mirrored_by_the_reference_model(tmp_path):
    """With audits on, the service and the reference model flag the same groups (the same hash
    of seed, prompt and visit) and run them on to k alike: the very same decisions."""
    prefix = tmp_path / "audit"
    code = bench.main(["--pool", "standard", "--k", "8", "--methods", "ds,sara-0.5",
                       "--groups", "256", "--prompts", "128", "--model-reps", "0",
                       "--audit", "0.3", "--no-progress", "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r for r in json.loads(prefix.with_suffix(".json").read_text())["results"]}
    sara = rows["sara-0.5"]
    assert sara["model"]["same_as_service"] and sara["settings"]["audit_fraction"] == 0.3
    assert sara["measured"]["counters"]["audits_mixed"] + \
        sara["measured"]["counters"]["audits_pure"] > 0
    assert bench.audit_draw(3, "p1", 0, 0.0) is False and bench.audit_draw(3, "p1", 0, 1.0)


# ------------------------------------------------------- auto against the grid over seeds


def test_grid_comparison_is_paired_by_seed():
    """A seed shifts every run alike (one pool, one outcome stream): the paired s.e. of the gap
    sees only the differences, so a steady 1% gap is met although the seeds spread by 10%."""
    fixed = {"sara-0.6": {0: 10.0, 1: 11.0, 2: 12.0},     # best by the seed-mean
             "sara-0.45": {0: 10.5, 1: 11.6, 2: 12.4}}
    auto = {s: 1.01 * v for s, v in fixed["sara-0.6"].items()}
    out = bench.compare_grid(auto, fixed, target=0.02)
    best = out["best_measured"]
    assert best["class"] == "sara-0.6" and best["gap"] == pytest.approx(0.01)
    # differences 0.10, 0.11, 0.12: s.d. 0.01, over the best's mean 11
    assert best["gap_se"] == pytest.approx(0.01 / 3 ** 0.5 / 11.0)
    assert best["verdict"] == "met"
    assert out["auto"][0] == pytest.approx(11.11) and out["auto"][1] > 0.5  # unpaired spread
    # closed form picks its own best (here the other class), with its own gap
    exact = {"sara-0.6": {0: 10.4, 1: 11.4, 2: 12.4}, "sara-0.45": {0: 10.2, 1: 11.2, 2: 12.2}}
    out = bench.compare_grid(auto, fixed, exact, target=0.02)
    assert out["best_exact"]["class"] == "sara-0.45"
    assert out["best_exact"]["gap"] == pytest.approx(sum(auto.values()) / 33.6 - 1)


def test_grid_verdicts():
    assert bench.verdict(0.005, 0.01, 0.02) == "met"
    assert bench.verdict(0.015, 0.01, 0.02).startswith("met at the mean")
    assert bench.verdict(0.025, 0.01, 0.02) == "missed at the mean, within noise"
    assert bench.verdict(0.04, 0.01, 0.02) == "missed beyond noise"
    assert bench.verdict(0.01, None, 0.02).startswith("met (one seed")
    assert bench.t95(4) == 2.78 and bench.t95(11) == 2.23 and bench.t95(100) == 1.96
    m, se = bench.mean_se([1.0, 2.0, 3.0])
    assert m == 2.0 and se == pytest.approx(1 / 3 ** 0.5)
    assert bench.mean_se([5.0]) == (5.0, None)


def test_grid_region_keeps_the_closed_form_best():
    cfgs = [bench.Config(pool="standard", k=8, prompts=128, groups=256, seed=s) for s in (0, 1)]
    everything = bench.grid_classes(8)
    near = bench.near_classes(cfgs, 0.05)
    assert 1 <= len(near) < len(everything) and all(c in everything for c in near)
    assert (3, 3) in [limits for limits, _ in near]        # the best plan on this pool
    assert bench.near_classes(cfgs, 10.0) == everything


def _write_pool(path: Path, gammas: list[float]) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}", "task": "math",
                                        "meta": {"p_success": g}}) + "\n"
                            for i, g in enumerate(gammas)))
    return path


def test_a_pool_file_runs_the_league_keys_on_its_own_success_chances(tmp_path):
    """--pool-file: the file's prompts and their meta.p_success are the pool, exactly (a pool
    of only hopeless and solved prompts but one column of mixed ones); GRESO runs on it under
    the league's keys and keeps today's JSON shape."""
    rng = random.Random(3)
    gammas = [0.0] * 40 + [1.0] * 40 + [rng.uniform(0.2, 0.8) for _ in range(48)]
    pool = _write_pool(tmp_path / "pool.jsonl", gammas)
    prefix = tmp_path / "league"
    # batches of 8 with one in the making: a prompt is rarely still in flight at its turn (one
    # group per prompt at a time passes it over), which the exact figures do not model
    code = bench.main(["--pool-file", str(pool), "--k", "8", "--methods", "ds,greso",
                       "--groups", "192", "--model-reps", "0", "--no-progress",
                       "--batch-size", "8", "--prefetch-batches", "1", "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r for r in json.loads(prefix.with_suffix(".json").read_text())["results"]}
    assert rows["ds"]["pool"] == "file:pool"
    ds, greso = rows["ds"]["measured"], rows["greso"]["measured"]
    # exact on the file's γ: DS pays for every saturated group of the 80 pure prompts
    assert ds["rollouts_per_effective"] == pytest.approx(
        rows["ds"]["exact"]["rollouts_per_effective"], rel=0.15)
    # GRESO skips the prompts that keep coming back pure, so it opens fewer groups for them
    assert greso["rollouts_per_effective"] < 0.8 * ds["rollouts_per_effective"]
    assert greso["counters"]["groups_skipped"] > 0 and greso["n_violations"] == 0


def test_too_few_groups_for_two_batches_stops_with_one_line_that_says_what_to_raise(tmp_path):
    """Pilot-Commit's groups of 4k fill one batch from 128 groups: no steady state to measure."""
    pool = _write_pool(tmp_path / "pool.jsonl", [0.5] * 60)
    with pytest.raises(SystemExit, match=r"^bench/allocation.py: pilot_commit \(service, 128 "
                                         r"groups\): .*nothing to measure \(raise --groups\)$"):
        bench.main(["--pool-file", str(pool), "--k", "8", "--methods", "pilot_commit",
                    "--groups", "128", "--model-reps", "0", "--no-progress", "--no-write"])


@pytest.mark.parametrize("line, fix", [
    ('{"id": "a", "meta": {"p_success": 1.5}}', "meta.p_success must be a number in [0, 1]"),
    ('{"id": "a", "meta": {}}', "meta.p_success must be a number in [0, 1]"),
    ('{"prompt": "no id", "meta": {"p_success": 0.5}}', "needs a string 'id'"),
    ('not json', "not JSON"),
])
def test_a_bad_pool_file_is_refused_with_its_line_and_the_fix(tmp_path, line, fix):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "meta": {"p_success": 0.5}}\n' + line + "\n")
    with pytest.raises(SystemExit, match=rf"line 2: .*{fix[:20]}"):
        bench.main(["--pool-file", str(path), "--methods", "ds", "--no-write"])


def test_a_pool_file_with_a_repeated_id_is_refused(tmp_path):
    path = _write_pool(tmp_path / "dup.jsonl", [0.5, 0.5])
    path.write_text(path.read_text() + '{"id": "q0", "meta": {"p_success": 0.1}}\n')
    with pytest.raises(SystemExit, match="appears twice"):
        bench.main(["--pool-file", str(path), "--methods", "ds", "--no-write"])


def test_reinforce_ada_runs_under_its_league_key_and_delivers_groups_of_k(tmp_path):
    """reinforce_ada: rounds of 2k up to 8k, delivered down-sampled to k (the driver flags any
    delivered group that is not k rollouts, mixed); a prompt that never succeeds, or never
    fails, spends its whole budget and is dropped, so on a pool of many such prompts it pays
    more per effective group than DS, which spends k on each."""
    rng = random.Random(5)
    gammas = [0.0] * 32 + [1.0] * 16 + [rng.uniform(0.3, 0.7) for _ in range(48)]
    pool = _write_pool(tmp_path / "pool.jsonl", gammas)
    prefix = tmp_path / "ada"
    code = bench.main(["--pool-file", str(pool), "--k", "4", "--methods",
                       "ds,reinforce_ada,reinforce_ada_pos", "--groups", "128",
                       "--model-reps", "0", "--no-progress", "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r["measured"] for r in
            json.loads(prefix.with_suffix(".json").read_text())["results"]}
    for key in ("reinforce_ada", "reinforce_ada_pos"):
        ada = rows[key]
        assert ada["n_violations"] == 0, ada["violations"]
        assert ada["counters"]["groups_dropped_saturated"] > 0
        assert ada["rollouts_per_effective"] > rows["ds"]["rollouts_per_effective"]
        assert ada["useful_fraction"] < rows["ds"]["useful_fraction"]   # k kept of what it drew


def test_pilot_commit_runs_under_its_league_key_and_delivers_whole_committed_groups(tmp_path):
    """pilot_commit: a pilot of k, in-band prompts filled to 4k and delivered whole (the driver
    flags any delivered group that is not 4k rollouts, mixed; it counts each as 4 groups of k);
    a solved prompt is piloted once and then skipped for the run, a hopeless one pays its pilot
    each epoch, so on a pool of many such prompts it pays less per group of k than DS, which
    spends k on each, every epoch."""
    rng = random.Random(5)
    gammas = [0.0] * 32 + [1.0] * 16 + [rng.uniform(0.3, 0.7) for _ in range(48)]
    pool = _write_pool(tmp_path / "pool.jsonl", gammas)
    prefix = tmp_path / "pc"
    code = bench.main(["--pool-file", str(pool), "--k", "4", "--methods",
                       "ds,pilot_commit,sara_pilot_commit", "--groups", "256", "--model-reps", "0",
                       "--no-progress", "--batch-size", "8", "--prefetch-batches", "1",
                       "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r["measured"] for r in
            json.loads(prefix.with_suffix(".json").read_text())["results"]}
    pc = rows["pilot_commit"]
    assert pc["n_violations"] == 0, pc["violations"]
    assert pc["counters"]["groups_skipped"] > 0          # the solved prompts, excluded
    assert pc["counters"]["groups_abandoned"] > 0
    assert pc["rollouts_per_effective"] < rows["ds"]["rollouts_per_effective"]
    # SARA's stopping spends less on the hopeless prompts' pilots, the rest alike
    sara_pc = rows["sara_pilot_commit"]
    assert sara_pc["n_violations"] == 0, sara_pc["violations"]
    assert sara_pc["rollouts_per_effective"] < pc["rollouts_per_effective"]


def test_var_k_runs_under_its_league_keys_and_sizes_groups_by_value(tmp_path):
    """var_k and sara_var_k: after a prompt's first group, each draw splits its budget of k per
    prompt by Knapsack RL's rule (a solved or hopeless prompt gets the minimum, a mixed one
    what its value asks); the driver counts a delivered group of n as n / k groups of k and
    flags any saturated one. On a pool where a third of the prompts are pure, the split pays
    less per group of k than DS, which spends k on each."""
    rng = random.Random(7)
    gammas = [0.0] * 16 + [1.0] * 16 + [rng.uniform(0.3, 0.7) for _ in range(48)]
    pool = _write_pool(tmp_path / "pool.jsonl", gammas)
    prefix = tmp_path / "vk"
    code = bench.main(["--pool-file", str(pool), "--k", "4", "--methods", "ds,var_k,sara_var_k",
                       "--groups", "256", "--model-reps", "0", "--no-progress",
                       "--out", str(prefix)])
    assert code == 0
    rows = {r["method"]: r["measured"] for r in
            json.loads(prefix.with_suffix(".json").read_text())["results"]}
    for key in ("var_k", "sara_var_k"):
        assert rows[key]["n_violations"] == 0, rows[key]["violations"]
        assert rows[key]["rollouts_per_effective"] < rows["ds"]["rollouts_per_effective"]
        assert rows[key]["effective"] != int(rows[key]["effective"])   # sizes other than k
        # the per-epoch figures count mixed groups of k too, as the run's figure does
        assert any(e["effective"] != int(e["effective"]) for e in rows[key]["by_epoch"])
