"""bench/e2e.py --testbed: the protocol's bookkeeping (targets, ratios, the testbed criteria, the
matched batch size, resuming) and a CI-size run of every method through the product path."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from sara_demo.testbed import SHIPPED_HABITS, verified_testbed

from .test_allocation_bench import BENCH, _load

_load("bench_e2e", "e2e.py")   # puts bench/ on sys.path for the modules below
testbed = _load("_testbed", "_testbed.py")
report = _load("_testbed_report", "_testbed_report.py")
cli = _load("_testbed_cli", "_testbed_cli.py")
stats = _load("_stats", "_stats.py")


def _run(method, seed, accs, step=1000, se=0.01, sat=(0.2, 0.2), mixed=100, **extra):
    curve = [{"rollouts": i * step, "tokens": 4 * i * step, "generation_s": float(i),
              "training_s": 2.0 * i, "steps": 10 * i, "accuracy": a, "accuracy_se": se,
              "frac_all_fail": sat[0], "frac_all_success": sat[1]} for i, a in enumerate(accs)]
    return {"method": method, "label": method, "seed": seed, "lr": 1e-4, "split": "test",
            "curve": curve, "rollouts": curve[-1]["rollouts"], "groups_mixed": mixed,
            "steps": curve[-1]["steps"], "seconds": 100.0, "pool_revisits": 5.0,
            "transitions": {"all_fail->mixed": 3}, "evaluation": testbed.EVALUATION, **extra}


def test_crossing_and_value_are_linear_between_points():
    points = [(0, 0.4), (100, 0.5), (300, 0.3), (400, 0.8)]
    assert stats.first_crossing(points, 0.45) == pytest.approx(50)
    assert stats.first_crossing(points, 0.6) == pytest.approx(300 + 100 * 0.3 / 0.5)
    assert stats.first_crossing(points, 0.9) is None
    assert stats.first_crossing(points, 0.3) == 0
    assert stats.value_at(points, 200) == pytest.approx(0.4)
    assert stats.value_at(points, 401) is None


def test_targets_ratios_and_verdicts_come_from_each_seeds_ds_run():
    runs = []
    for seed in (0, 1):
        runs.append(_run("ds", seed, [0.4, 0.5, 0.6, 0.7, 0.7]))      # final 0.7
        runs.append(_run("sara", seed, [0.4, 0.6, 0.7, 0.72, 0.72]))  # 0.7 at 2000 vs DS 3000
        runs.append(_run("uniform_matched", seed, [0.4, 0.45, 0.5, 0.6, 0.7]))
    assert report.targets(runs, 0) == pytest.approx({"ds_final": 0.7, "halfway": 0.55})
    summary = [report.method_summary(runs, m, 4000) for m in ("ds", "sara", "uniform_matched")]
    by = {s["method"]: s for s in summary}
    assert by["sara"]["ds_final_rollouts"][0] == pytest.approx(2000)
    assert by["sara"]["ds_final_rollouts_ratio"][:1] == (pytest.approx(2 / 3),)
    assert by["ds"]["ds_final_rollouts_ratio"][0] == pytest.approx(1.0)
    assert by["sara"]["halfway_tokens"][0] == pytest.approx(4 * 750)
    goals = report.target_ratios(summary)
    assert goals["sara_vs_ds"]["met"] and goals["sara_vs_ds"]["bound"] == 0.8
    assert goals["sara_below_uniform_matched"]["met"]
    text = report.format_report(summary, report.criteria(runs), runs)
    assert "to DS's final accuracy" in text and "testbed criteria" in text
    assert "0.67" in text.split("per run")[1]      # each SARA seed's own ratio
    assert goals["sara_vs_ds"]["ratio_at_least"] == pytest.approx(2 / 3)
    assert goals["sara_vs_ds"]["seeds_not_reached"] == 0


def test_a_seed_that_never_reaches_the_target_counts_with_all_it_spent():
    runs = [_run("ds", 0, [0.4, 0.5, 0.6, 0.7, 0.7]), _run("ds", 1, [0.4, 0.5, 0.6, 0.7, 0.7]),
            _run("sara", 0, [0.4, 0.7, 0.7, 0.7, 0.7]),     # 0.7 at 1,000: 1/3 of DS's 3,000
            _run("sara", 1, [0.4, 0.5, 0.55, 0.6, 0.6])]    # never: all 4,000 count
    summary = [report.method_summary(runs, m, 4000) for m in ("ds", "sara")]
    goal = report.target_ratios(summary)["sara_vs_ds"]
    assert goal["ratio"] == pytest.approx(1 / 3) and goal["seeds"] == 1   # the survivor alone
    assert goal["ratio_at_least"] == pytest.approx((1 / 3 + 4 / 3) / 2)
    assert goal["seeds_not_reached"] == 1
    assert not goal["met"] and not goal["met_at_mean"]


def test_accuracy_at_equal_steps_and_generation_cost_per_rollout():
    accs = [0.4 + 0.01 * i for i in range(12)]           # step 10 i: step 100 is point 10
    short = _run("sara", 1, [0.4, 0.5])                   # never reaches step 100: left out
    figures = report.method_summary([_run("sara", 0, accs), short], "sara", 11_000)
    assert figures["acc_at_steps"] == (pytest.approx(0.5), 0.0)
    # 1 generation second per 1,000 rollouts on both runs' curves
    assert figures["generation_ms_per_rollout"][0] == pytest.approx(1.0)
    assert "@ 100 steps" in report.format_tables([figures], report.criteria([short]))


def test_bucket_shares_are_each_methods_committed_groups_by_bucket():
    runs = [_run("ds", 0, [0.4, 0.5], by_bucket={"add2": {"committed": 30}, "mul2": {"committed": 10}}),
            _run("ds", 1, [0.4, 0.5], by_bucket={"add2": {"committed": 10}, "mul2": {"committed": 10}}),
            _run("sara", 0, [0.4, 0.5])]                  # no by_bucket: left out
    shares = report.bucket_shares(runs, "ds")
    assert shares["add2"][0] == pytest.approx((0.75 + 0.5) / 2)
    assert shares["mul2"][0] == pytest.approx((0.25 + 0.5) / 2)
    assert report.bucket_shares(runs, "sara") == {}
    text = report.format_bucket_shares(runs)
    assert "mul2" in text and "sara" not in text.split("\n", 3)[-1]
    assert report.format_bucket_shares([_run("ds", 0, [0.4])]) == ""


def test_bucket_gains_are_each_seeds_end_minus_start_per_bucket():
    sizes = {"add2": 400, "mul2": 390}
    runs = [_run("ds", 0, [0.4, 0.5], problems_by_bucket=sizes, accuracy_by_bucket=[
                {"add2": 0.30, "mul2": 0.50}, {"add2": 0.50, "mul2": 0.50}]),
            _run("ds", 1, [0.4, 0.5], problems_by_bucket=sizes, accuracy_by_bucket=[
                {"add2": 0.30, "mul2": 0.50}, {"add2": 0.40, "mul2": 0.60}]),
            _run("sara", 0, [0.4, 0.5], problems_by_bucket=sizes, accuracy_by_bucket=[
                {"add2": 0.30}, {"add2": 0.35}]),
            _run("dps", 0, [0.4, 0.5])]                   # recorded before: left out
    gains = report.bucket_gains(runs, "ds")
    assert gains["add2"][0] == pytest.approx(0.15) and gains["mul2"][0] == pytest.approx(0.05)
    assert report.bucket_gains(runs, "dps") == {}
    lines = report.format_bucket_gains(runs).splitlines()
    assert lines[3].split() == ["test", "problems", "400", "390"]
    assert lines[4].split()[:4] == ["ds", "15.0", "±", "63.5"]      # t(1) half-width of 0.1, 0.2
    assert lines[5].split() == ["sara", "5.0", "±", "0.0", "-"] and "dps" not in lines[-1]
    assert report.format_bucket_gains([_run("ds", 0, [0.4])]) == ""


def test_bucket_gains_at_ds_budget_read_a_longer_run_where_ds_stopped():
    sizes = {"sub3": 400}
    # DS stops at 1,000 rollouts; SARA runs to 2,000 and gains most after DS's end
    runs = [_run("ds", 0, [0.4, 0.5], problems_by_bucket=sizes,
                 accuracy_by_bucket=[{"sub3": 0.10}, {"sub3": 0.30}]),
            _run("sara", 0, [0.4, 0.5, 0.6], problems_by_bucket=sizes,
                 accuracy_by_bucket=[{"sub3": 0.10}, {"sub3": 0.20}, {"sub3": 0.70}]),
            _run("sara", 1, [0.4, 0.5], problems_by_bucket=sizes,   # no DS run in seed 1
                 accuracy_by_bucket=[{"sub3": 0.10}, {"sub3": 0.90}])]
    assert report.bucket_gains(runs, "sara")["sub3"][0] == pytest.approx(0.7)   # to each end
    at_budget = report.bucket_gains(runs, "sara", at_ds_budget=True)
    assert at_budget["sub3"] == (pytest.approx(0.10), 0.0)     # seed 0 only, at 1,000 rollouts
    text = report.format_bucket_gains(runs, at_ds_budget=True)
    assert "at DS's budget" in text.splitlines()[0]
    assert text.splitlines()[-1].split()[:2] == ["sara", "10.0"]


def test_lasting_learning_is_judged_in_standard_errors():
    # 0.40 -> 0.60 rising until the last points, steps 0..160
    slow = _run("ds", 0, [0.40, 0.46, 0.50, 0.53, 0.55, 0.57, 0.58, 0.595, 0.60, 0.60, 0.60,
                          0.60, 0.60, 0.60, 0.60, 0.60, 0.60][:11], se=0.011)
    figures = report.learning_lasts(slow)
    assert figures["rising_until_step"] == 70 and figures["steps"] == 100
    assert figures["gain"] == pytest.approx(0.2)
    # half the run is step 50: 0.57, final 0.60: 2.7 SE
    assert figures["half_run_gap_se"] == pytest.approx(0.03 / 0.011)
    crit = report.criteria([slow, _run("uniform", 0, [0.4, 0.5], sat=(0.1, 0.25))])
    assert not crit["ds_learning_pass"]            # 70 < 100 steps and 2.7 < 3 SE
    assert crit["uniform_saturation_pass"]          # 35% saturated, both kinds present
    assert crit["uniform_transitions"] == {"all_fail->mixed": 3}
    assert not report.criteria([_run("uniform", 0, [0.4], sat=(0.3, 0.0))])[
        "uniform_saturation_pass"]                  # no all-success group


def test_a_missed_criterion_names_the_methods_that_miss_it():
    runs = [_run("ds", 0, [0.4, 0.5]), _run("ds", 1, [0.4, 0.5], seconds=190.0),
            _run("reinforce_ada", 0, [0.4, 0.5], pool_revisits=1.4),
            _run("reinforce_ada", 1, [0.4, 0.5], pool_revisits=1.5)]
    crit = report.criteria(runs)
    assert not crit["revisit_pass"] and not crit["run_time_pass"]
    assert crit["revisits_below"] == {"reinforce_ada": {"runs": 2, "of": 2, "min": 1.4,
                                                        "max": 1.5}}
    assert crit["runs_over"] == {"ds": {"runs": 1, "of": 2, "min": 190.0, "max": 190.0}}
    text = report.format_criteria(crit)
    assert "pool revisits: at least 1.4: NOT met; missed by reinforce_ada 2/2 (1.4-1.5)" in text
    assert "longest run: 190 s (at most 180 s for DS's budget, in proportion for longer ones): " \
        "NOT met; missed by ds 1/2 (190-190 s)" in text
    # a run allowed 1.5x DS's rollouts is allowed 1.5x the time
    longer = {"budget": 165_000, "protocol": {"rollouts": 110_000}}
    assert report.criteria([_run("sara", 0, [0.4, 0.5], seconds=260.0, **longer)])[
        "run_time_pass"]
    assert not report.criteria([_run("sara", 0, [0.4, 0.5], seconds=280.0, **longer)])[
        "run_time_pass"]
    assert "missed by" not in report.format_criteria(report.criteria(runs[:1]))
    assert "saturation under uniform: not measured (no uniform runs)" in text


def test_the_json_report_is_strict_json_with_null_for_what_no_seed_reached(tmp_path):
    runs = [_run("ds", 0, [0.4, 0.5, 0.6, 0.7, 0.7]),
            _run("sara", 0, [0.4, 0.5, 0.55, 0.6, 0.6])]      # never reaches DS's final
    args = argparse.Namespace(methods=["ds", "sara"])
    chosen = {m: {"lr": 1e-4, "how": "validation",
                  "validation_final_accuracy": {1e-4: 0.6, 3e-4: 0.5}} for m in ("ds", "sara")}
    cli.write_outputs(tmp_path / "tb", args, ["--testbed"], testbed.Protocol(), runs, chosen, 1.0)

    def refuse(token):
        raise AssertionError(f"{token} is not JSON")

    result = json.loads((tmp_path / "tb.json").read_text(), parse_constant=refuse)
    assert result["targets"]["sara_vs_ds"]["ratio"] is None           # no seed reached it
    assert result["targets"]["sara_vs_ds"]["seeds_not_reached"] == 1
    assert result["criteria"]["uniform_min_saturated"] is None        # no uniform run
    assert result["lr_selection"]["ds"]["validation_final_accuracy"] == {"0.0001": 0.6,
                                                                         "0.0003": 0.5}
    assert [r["method"] for r in result["runs"]] == ["ds", "sara"]


def test_matched_batch_holds_b_mixed_groups_in_expectation():
    protocol = testbed.Protocol(batch_groups=16, max_matched=8)
    assert testbed.matched_cap(protocol, 0.5) == 40          # 1.25 x 16 / 0.5
    assert testbed.matched_cap(protocol, 0.01) == 128        # at most 8 B
    size = testbed._matched_sizer(protocol, first_mixed=0.5, cap=100)
    assert size([]) == 32                           # the probe's fraction before any batch
    history = [{"groups": 64, "groups_mixed": 16}] * 5
    assert size(history) == 64
    assert size([{"groups": 100, "groups_mixed": 0}]) == 100  # never past the cap
    assert size([{"groups": 16, "groups_mixed": 16}]) == 16   # never below B


def test_methods_differ_only_in_their_scheduler_settings(tmp_path):
    protocol = testbed.Protocol()
    configs = {m: testbed._demo_config(m, 3, 1e-4, protocol, tmp_path) for m in testbed.METHODS}
    assert {(c.policy, c.selection, tuple(sorted(c.scheduler_options.items())))
            for c in configs.values()} == {
        ("uniform", "epoch", ()), ("dynamic_sampling", "epoch", ()),
        ("sara", "epoch", (("tau_low", 0.5),)), ("sara", "epoch", (("tau_low", "auto"),)),
        ("sara", "epoch", (("prior", "history"), ("tau_low", 0.5))),
        ("dynamic_sampling", "dps", ()), ("dynamic_sampling", "mopps", ()),
        ("sara", "dps", (("tau_low", 0.5),)), ("dynamic_sampling", "greso", ()),
        ("sara", "greso", (("tau_low", 0.5),)),
        # Reinforce-Ada: groups of k delivered from rounds of 2k, up to 8k a prompt
        ("reinforce_ada", "epoch", (("ada_keep", 8), ("ada_round", 16), ("group_size", 64))),
        # Pilot-Commit: a pilot of k, groups of 4k, B of them a step
        ("pilot_commit", "epoch", (("group_size", 32), ("pc_pilot", 8))),
        ("pilot_commit", "epoch", (("group_size", 32), ("pc_pilot", 8), ("pc_tau_low", 0.5))),
        # var_k: Knapsack RL's split of B * k over each batch's B prompts, 2 to 8k each
        ("dynamic_sampling", "epoch", (("group_sizing", "var_k"), ("vk_batch", 16),
                                       ("vk_max", 64), ("vk_min", 2))),
        ("sara", "epoch", (("group_sizing", "var_k"), ("tau_low", 0.5), ("vk_batch", 16),
                           ("vk_max", 64), ("vk_min", 2))),
        # SARA with a lower threshold on the failing side, alone and with DPS
        ("sara", "epoch", (("tau_low", 0.5), ("tau_low_fail", 0.3))),
        ("sara", "dps", (("tau_low", 0.5), ("tau_low_fail", 0.3))),
        ("sara", "dps", (("selection_rank", "opening"), ("tau_low", 0.5))),
        # DPS and MoPPS as their papers run them (no filter), and the arm at 4k
        ("uniform", "dps", ()), ("uniform", "mopps", ())}
    shared = {(c.seed, c.lr, c.batch_groups, tuple(sorted(c.trainer_options.items())))
              for c in configs.values()}
    assert len(shared) == 1
    # DS runs to the budget, every other method to others_budget times it; the arm at 4k
    assert {m: c.rollout_budget for m, c in configs.items() if c.rollout_budget
            == protocol.rollouts} == {"ds": protocol.rollouts}
    assert {c.rollout_budget for m, c in configs.items() if m != "ds"} == {165_000}
    assert {m for m, c in configs.items() if c.group_size != protocol.k} == {"ds_k32",
                                                                            "uniform_k32"}
    assert configs["ds_k32"].group_size == 32 and configs["ds_k32"].policy == "dynamic_sampling"


def test_mixed_groups_are_counted_in_groups_of_k_whatever_their_size():
    k = {"protocol": {"k": 8}}
    assert report.mixed_groups_of_k({"groups_mixed": 10, **k}) == 10   # before Pilot-Commit
    assert report.mixed_groups_of_k({"groups_mixed": 10, "group_rollouts": 32, **k}) == 40
    # var_k: sizes vary, so the rollouts in mixed groups count (a group of 12 is 1.5 of k)
    assert report.mixed_groups_of_k({"groups_mixed": 2, "group_rollouts": None,
                                     "rollouts_mixed": 12 + 4, **k}) == 2.0


def test_arguments_are_checked_and_ds_is_always_run():
    args = cli.parse_args(["--methods", "sara", "--lr", "sara=3e-4"])
    assert args.methods == ["ds", "sara"] and args.lr == {"sara": 3e-4}
    assert args.lr_grid == [1e-4, 2e-4, 3e-4, 5e-4]
    assert cli.parse_args(["--quick"]).lr_grid == [3e-4]
    assert cli.protocol_of(args) == testbed.Protocol()
    sized = cli.protocol_of(cli.parse_args(["--test-size", "2000", "--val-size", "1000"]))
    assert (sized.test_size, sized.val_size, sized.rollouts) == (2000, 1000, 110_000)
    assert (sized.pool_size, sized.prefetch_batches, sized.max_staleness) == (2000, 4, 4)
    assert cli.protocol_of(cli.parse_args(["--quick"])).pool_size == 1000   # CI's floors' pool
    assert cli.protocol_of(cli.parse_args(["--quick", "--rollouts", "999"])) == \
        testbed.Protocol(**{**testbed.asdict(testbed.Protocol.quick()), "rollouts": 999})
    flow = cli.protocol_of(cli.parse_args(["--prefetch-batches", "2", "--max-staleness", "2"]))
    assert (flow.prefetch_batches, flow.max_staleness) == (2, 2)
    assert cli.protocol_of(cli.parse_args(["--evals", "8"])).evals == 8
    assert cli.protocol_of(cli.parse_args(["--work-floor", "2"])).work_floor == 2.0
    assert cli.protocol_of(cli.parse_args(["--pool-size", "1000"])).pool_size == 1000
    for bad in (["--pool-size", "0"], ["--methods", "grpo"], ["--seeds", "a"], ["--lr", "nope=1e-4"],
                ["--prefetch-batches", "0"], ["--max-staleness", "-1"], ["--evals", "0"],
                ["--work-floor", "0.5"], ["--work-floor", "17"]):
        with pytest.raises(SystemExit):
            cli.parse_args(bad)


def test_flow_control_is_the_protocols_and_the_same_for_every_method(tmp_path):
    protocol = testbed.Protocol(prefetch_batches=2, max_staleness=3, work_floor=2.0)
    for method in testbed.METHODS:
        cfg = testbed._demo_config(method, 0, 1e-4, protocol, tmp_path)
        assert (cfg.prefetch_batches, cfg.max_staleness) == (2, 3), method
        assert cfg.scheduler_options["work_floor"] == 2.0, method
        off = testbed._demo_config(method, 0, 1e-4, testbed.Protocol(), tmp_path)
        assert "work_floor" not in off.scheduler_options, method   # the service's default


def test_lr_is_chosen_on_validation_and_finished_runs_are_not_repeated(tmp_path, monkeypatch):
    calls = []

    shipped = testbed.warm_start_identity(verified_testbed())

    def fake_run(method, seed, lr, protocol, work, split="test", start_from=None):
        calls.append((method, seed, lr, split))
        best = {"ds": 1e-4, "sara": 3e-4}[method]
        return _run(method, seed, [0.4, 0.5 if lr == best else 0.45], split=split, lr=lr,
                    protocol=testbed.asdict(protocol), start=shipped)

    monkeypatch.setattr(cli, "run_one", fake_run)
    args = cli.parse_args(["--methods", "ds,sara", "--lr-grid", "1e-4,3e-4", "--seeds", "0"])
    rec = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False)
    chosen = cli.choose_lrs(args, testbed.Protocol(), rec, tmp_path)
    assert chosen["ds"]["lr"] == 1e-4 and chosen["sara"]["lr"] == 3e-4
    assert len(calls) == 4 and {c[3] for c in calls} == {"validation"}
    again = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False)   # a restart reads them back
    cli.choose_lrs(args, testbed.Protocol(), again, tmp_path)
    assert len(calls) == 4
    # each recorded run names the commit it ran at, and the report counts them
    assert all(r["code"] == cli.git_state(cli.CODE_PATHS) for r in again.runs)
    older = _run("ds", 1, [0.4, 0.5])
    head = cli.git_state(cli.CODE_PATHS).replace(" (clean)", "")
    assert cli.runs_code([older, *again.runs]) == f"4 at {head}; 1 at a commit not kept"


def test_recommended_reports_the_recommended_keys_runs_without_running_twice(tmp_path,
                                                                            monkeypatch):
    calls = []
    shipped = testbed.warm_start_identity(verified_testbed())
    protocol = testbed.Protocol()

    def fake_run(method, seed, lr, protocol, work, split="test", start_from=None):
        calls.append(method)
        return _run(method, seed, [0.4, 0.5], split=split, lr=lr,
                    protocol=testbed.asdict(protocol), start=shipped)

    monkeypatch.setattr(cli, "run_one", fake_run)
    rec = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False)
    got = rec.run("recommended", 0, 1e-4, "test", protocol, tmp_path, "[1/1]")
    assert calls == [testbed.RECOMMENDED]          # recorded once, under its own key
    assert got["method"] == "recommended" and got["label"].startswith("recommended (= ")
    again = rec.run(testbed.RECOMMENDED, 0, 1e-4, "test", protocol, tmp_path, "[1/1]")
    assert calls == [testbed.RECOMMENDED] and again["method"] == testbed.RECOMMENDED
    assert got["curve"] == again["curve"]
    assert testbed.METHODS["recommended"] == testbed.METHODS[testbed.RECOMMENDED]


def test_the_recommended_keys_source_runs_on_the_principal_seeds():
    args = cli.parse_args(["--seeds", "0,1,2,3", "--secondary-seeds", "0,1",
                           "--methods", f"ds,mopps,{testbed.RECOMMENDED},recommended"])
    assert testbed.RECOMMENDED not in testbed.PRINCIPAL   # else this test tells nothing
    assert cli.seeds_of(args, testbed.RECOMMENDED) == [0, 1, 2, 3]
    assert cli.seeds_of(args, "recommended") == [0, 1, 2, 3]
    assert cli.seeds_of(args, "mopps") == [0, 1]


def test_report_only_writes_the_recorded_runs_and_runs_nothing(tmp_path, monkeypatch, capsys):
    protocol = testbed.Protocol()
    shipped = testbed.warm_start_identity(verified_testbed())
    recorded = [_run(m, seed, [0.4, 0.5, 0.6], lr=3e-4, protocol=testbed.asdict(protocol),
                     start=shipped) for m, seed in (("ds", 0), ("ds", 1), ("sara", 0))]
    (tmp_path / "t.runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recorded))

    def no_run(*args, **kwargs):
        raise AssertionError("--report-only ran a run")

    monkeypatch.setattr(cli, "run_one", no_run)
    monkeypatch.setattr(cli, "chart", lambda runs, path: False)
    argv = ["--methods", "ds,sara,mopps", "--seeds", "0,1", "--lr-grid", "3e-4",
            "--out", str(tmp_path / "t"), "--report-only"]
    assert cli.main(argv) == 0
    said = capsys.readouterr()
    assert "left out of the report: mopps seed 0, sara seed 1, mopps seed 1" in said.out + said.err
    result = json.loads((tmp_path / "t.json").read_text())
    assert sorted((r["method"], r["seed"]) for r in result["runs"]) == [
        ("ds", 0), ("ds", 1), ("sara", 0)]
    with pytest.raises(SystemExit):    # a grid would need validation runs
        cli.parse_args(["--lr-grid", "1e-4,3e-4", "--report-only"])
    (tmp_path / "t.runs.jsonl").write_text(json.dumps(recorded[2]) + "\n")
    with pytest.raises(SystemExit, match="no recorded DS run"):
        cli.main(argv)


def test_runs_from_another_warm_start_are_not_taken_as_done(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(verified_testbed(), other)
    manifest = json.loads((other / "warmstart.json").read_text())
    (other / "model.safetensors").write_bytes(b"not the shipped weights")
    manifest["sha256"]["model.safetensors"] = hashlib.sha256(b"not the shipped weights").hexdigest()
    (other / "warmstart.json").write_text(json.dumps(manifest))
    protocol = testbed.Protocol()
    ran = _run("ds", 0, [0.4, 0.5], protocol=testbed.asdict(protocol),
               start=testbed.warm_start_identity(verified_testbed()))
    (tmp_path / "t.runs.jsonl").write_text(json.dumps(ran) + "\n")
    shipped = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False)
    assert shipped.find("ds", 0, 1e-4, "test", protocol) == ran
    assert shipped.find("ds", 0, 1e-4, "test", testbed.Protocol(rollouts=10)) is None
    elsewhere = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False, start_from=str(other))
    assert elsewhere.find("ds", 0, 1e-4, "test", protocol) is None
    # recorded before the protocol had its flow-control fields: at their values then (1, 1)
    then = testbed.Protocol(prefetch_batches=1, max_staleness=1)
    older = {**ran, "protocol": {k: v for k, v in testbed.asdict(then).items()
                                 if k not in ("prefetch_batches", "max_staleness", "work_floor")}}
    (tmp_path / "t.runs.jsonl").write_text(json.dumps(older) + "\n")
    again = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False)
    assert again.find("ds", 0, 1e-4, "test", then) == older
    assert again.find("ds", 0, 1e-4, "test", protocol) is None   # four batches in the making
    assert again.find("ds", 0, 1e-4, "test", testbed.Protocol(
        prefetch_batches=1, max_staleness=1, work_floor=2.0)) is None   # no floor then
    for field in ("start", "evaluation"):   # recorded before runs named it
        legacy = {k: v for k, v in ran.items() if k != field}
        (tmp_path / "t.runs.jsonl").write_text(json.dumps(legacy) + "\n")
        assert cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False).find(
            "ds", 0, 1e-4, "test", protocol) is None, field


def test_a_run_is_matched_on_the_split_it_read_not_the_other_splits_size(tmp_path):
    shipped = testbed.warm_start_identity(verified_testbed())
    recorded = testbed.Protocol(test_size=4000, val_size=2000)
    runs = [_run("ds", 0, [0.4, 0.5], split=split, protocol=testbed.asdict(recorded),
                 start=shipped) for split in ("validation", "test")]
    (tmp_path / "t.runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    rec = cli.Recorder(tmp_path / "t.runs.jsonl", fresh=False)
    larger_test = testbed.Protocol(test_size=8000, val_size=2000)
    assert rec.find("ds", 0, 1e-4, "validation", larger_test) == runs[0]
    assert rec.find("ds", 0, 1e-4, "test", larger_test) is None
    larger_val = testbed.Protocol(test_size=4000, val_size=3000)
    assert rec.find("ds", 0, 1e-4, "test", larger_val) == runs[1]
    assert rec.find("ds", 0, 1e-4, "validation", larger_val) is None
    # any other field still tells protocols apart, on either split
    for split in ("validation", "test"):
        assert rec.find("ds", 0, 1e-4, split, testbed.Protocol(test_size=8000, k=4)) is None


@pytest.mark.parametrize("name", ["testbed", "testbed_k16"])
def test_the_recorded_command_finds_every_run_of_the_recording(name):
    # the recording's own command (its argv) resumes it: every run it reports is found in its
    # runs file under the protocol that command gives, so rerunning it runs nothing
    recording = json.loads((BENCH / "results" / f"{name}.json").read_text())
    args = cli.parse_args(recording["argv"])
    assert args.out == f"bench/results/{name}" and not args.report_only
    protocol = cli.protocol_of(args)
    assert dataclasses.asdict(protocol) == recording["protocol"]
    rec = cli.Recorder(BENCH / "results" / f"{name}.runs.jsonl", fresh=False)
    jobs = {(m, s) for m in args.methods for s in cli.seeds_of(args, m)}
    assert {(r["method"], r["seed"]) for r in recording["runs"]} == jobs
    for run in recording["runs"]:
        assert rec.find(run["method"], run["seed"], run["lr"], run["split"], protocol) is not None, \
            (run["method"], run["seed"], run["lr"], run["split"])


def test_the_run_record_names_its_warm_start():
    identity = testbed.warm_start_identity(verified_testbed())
    manifest = json.loads((verified_testbed() / "warmstart.json").read_text())
    assert identity["weights_sha256"] == manifest["sha256"]["model.safetensors"]
    assert identity["habits"] == SHIPPED_HABITS


# Every policy (Reinforce-Ada's rounds and Pilot-Commit's pilots included), every kind of
# selection (model-based: DPS; filter: GRESO) and the matched batch sizer, ~40 s a run here. The
# other keys differ from these only in scheduler settings
# (test_methods_differ_only_in_their_scheduler_settings), each of which tests/api runs; all
# fourteen at CI size would be 9-10 minutes of CI for no further code path.
QUICK_METHODS = ("ds", "sara", "uniform", "uniform_matched", "sara_dps", "sara_greso",
                 "reinforce_ada", "pilot_commit")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quick_testbed_run_of_each_policy_and_selection(tmp_path):
    assert set(QUICK_METHODS) <= set(testbed.METHODS)
    prefix = tmp_path / "tb"
    run = subprocess.run(
        [sys.executable, str(BENCH / "e2e.py"), "--testbed", "--quick", "--seeds", "7",
         "--methods", ",".join(QUICK_METHODS),
         "--out", str(prefix), "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=1150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(prefix.with_suffix(".json").read_text())
    runs = {r["method"]: r for r in result["runs"]}
    assert set(runs) == set(QUICK_METHODS)
    keys = {"rollouts", "tokens", "generation_s", "training_s", "steps", "accuracy",
            "accuracy_se", "frac_all_fail", "frac_all_success"}
    for method, r in runs.items():
        curve = r["curve"]
        assert r["seed"] == 7 and r["lr"] == 3e-4 and r["pool_revisits"] > 0
        assert curve[0]["rollouts"] == 0 and curve[0]["steps"] == 0
        # every point, the ones evaluated in the child process while training went on included
        assert all(set(point) == keys for point in curve), curve
        assert r["evaluation"] == testbed.EVALUATION and len(curve) >= 3
        # per bucket, beside the curve: one entry a point, over the test split's problems
        assert len(r["accuracy_by_bucket"]) == len(curve)
        assert sum(r["problems_by_bucket"].values()) == result["protocol"]["test_size"]
        busiest = r["busiest_prompts"][0]       # the prompt that gave the most trained groups
        assert busiest["groups"] == r["trained"]["most_groups_one_prompt"]
        assert busiest["bucket"] in r["problems_by_bucket"], busiest
        if method == "ds":
            # DS learns within the quick budget (seed 7, four runs: 38.3 -> 48.0-53.3%)
            assert curve[-1]["accuracy"] > curve[0]["accuracy"] + 0.05, curve
        elif method == "uniform":
            # uniform moves nothing here but drifts: its batches are four-fifths saturated and
            # the token-mean loss divides the few mixed groups' gradient by all of the batch's
            # tokens, over 188 steps. Seeds 7, 8, 9 ended at 41.8, 28.0, 31.0% from 38.2%, and
            # at 33.0, 40.8, 31.0% with the fused GELU (float rounding only); at 1e-3 it
            # collapses to about 3%, which this floor catches
            assert curve[-1]["accuracy"] > curve[0]["accuracy"] - 0.15, (method, curve)
        else:
            # 6,000 rollouts are some forty-five steps; the rest may not have moved yet, and the
            # test split's 400 problems have an SE of 2.4 points (SARA measured 38.3 -> 35.5% once,
            # on a loaded box). Each must run and hold its ground.
            assert curve[-1]["accuracy"] > curve[0]["accuracy"] - 0.05, (method, curve)
        assert curve[-1]["generation_s"] > 0 and curve[-1]["training_s"] > 0
        assert [p["rollouts"] for p in curve] == sorted(p["rollouts"] for p in curve)
    b = result["protocol"]["batch_groups"]
    assert max(runs["uniform_matched"]["batch_sizes"]) > b >= max(runs["uniform"]["batch_sizes"])
    assert "testbed criteria" in prefix.with_suffix(".txt").read_text()
    for method, r in runs.items():   # the scheduler's per-prompt counts, read before it stops
        assert sum(b["committed"] for b in r["by_bucket"].values()) >= r["groups_mixed"] > 0, method
        # what it trained on, from the trainer's steps: every delivered group, by successes
        trained = r["trained"]
        assert trained["groups"] == r["groups_delivered"], method
        assert sum(trained["success_shares"]) == pytest.approx(1.0)
        assert 0 < trained["distinct_prompts"] <= trained["groups"]
    assert "trained groups" in prefix.with_suffix(".txt").read_text()
    assert prefix.with_suffix(".png").stat().st_size > 10_000


def test_the_chart_draws_every_method_of_the_eleven_and_more(tmp_path):
    # tab10 has ten colours: the eleventh key (uniform_matched, sorted last) once had none
    pytest.importorskip("matplotlib")
    runs = [_run(m, s, [0.3, 0.4 + 0.01 * s, 0.5]) for m in testbed.METHODS for s in (0, 1)]
    assert len({r["method"] for r in runs}) >= 11
    assert report.chart(runs, tmp_path / "c.png") and (tmp_path / "c.png").stat().st_size > 0


def test_ds_is_drawn_first_in_black_and_no_two_methods_share_a_colour():
    palette = [(i / 40, 0.5, 0.5) for i in range(len(testbed.METHODS) - 1)]
    colors = report.method_colors(set(testbed.METHODS), palette)
    assert next(iter(colors)) == "ds" and colors["ds"] == "black"
    assert len(set(colors.values())) == len(colors) == len(testbed.METHODS)
    assert list(colors)[1:] == sorted(m for m in testbed.METHODS if m != "ds")
    assert report.method_colors({"sara", "dps"}, palette[:1]) == {"dps": palette[0],
                                                                   "sara": palette[0]}


def test_a_methodsmean_curve_averages_its_runs_on_a_common_grid():
    grid, mean = report.mean_curve([_run("ds", 0, [0.2, 0.4]), _run("ds", 1, [0.4, 0.6])],
                                    points=3)
    assert grid == [0.0, 500.0, 1000.0]
    assert mean == [pytest.approx(30.0), pytest.approx(40.0), pytest.approx(50.0)]


def test_the_new_targets_final_gap_busiest_prompt_and_recommendation():
    def trained(most: int, groups: int) -> dict:
        return {"trained": {"most_groups_one_prompt": most, "groups": groups}}

    runs = []
    for seed in (0, 1, 2, 3, 4):
        runs.append(_run("ds", seed, [0.4, 0.5, 0.6, 0.7, 0.7], **trained(9, 3000)))
        # reaches DS's final at 2,000 on every seed, ends 0.5 points below it: within 1 point
        runs.append(_run("sara_dps", seed, [0.4, 0.6, 0.7, 0.695, 0.695], **trained(30, 6000)))
        # reaches it at 1,714 (0.57 of DS's 3,000) on 4 seeds of 5
        accs = [0.4, 0.65, 0.72, 0.72, 0.72] if seed else [0.4, 0.5, 0.55, 0.6, 0.6]
        runs.append(_run("sara", seed, accs, **trained(12, 3000)))
    summary = [report.method_summary(runs, m, 4000) for m in ("ds", "sara_dps", "sara")]
    goals = report.target_ratios(summary, runs)
    gap = goals["sara_dps_final_vs_ds"]
    assert gap["gap"] == pytest.approx(-0.005) and gap["met"]
    busiest = goals["busiest_prompt"]
    assert busiest["worst_ratio"] == {"sara_dps": pytest.approx(30 / 9),
                                      "sara": pytest.approx(12 / 9)}
    assert busiest["over"] == ["sara_dps"] and not busiest["met"]
    # SARA + DPS trained twice DS's groups: per trained group its busiest is 30/6000 : 9/3000
    assert busiest["worst_ratio_per_group"] == {"sara_dps": pytest.approx(30 / 9 / 2),
                                                "sara": pytest.approx(12 / 9)}
    assert busiest["met_per_group"] and busiest["over_per_group"] == []
    # SARA reaches DS's final on 4 of 5 seeds (80%), at 0.57x: fewer than SARA + DPS's 0.67x
    choice = goals["recommend"]
    assert choice["method"] == "sara"
    assert choice["ratio"] == pytest.approx((1000 + 1000 * 0.05 / 0.07) / 3000)
    assert set(choice["eligible"]) == {"sara", "sara_dps"}


def test_the_arm_at_its_own_group_size_is_read_against_its_own_ds():
    runs = [_run("ds_k32", 0, [0.4, 0.5, 0.6, 0.6]), _run("pilot_commit_k32", 0, [0.4, 0.6, 0.6]),
            _run("uniform_k32", 0, [0.4, 0.45, 0.5, 0.55])]
    arm = report.arm_summary(runs, "ds_k32", report.K32_ARM)
    by = {e["method"]: e for e in arm}
    assert by["pilot_commit_k32"]["ratio_to_reference"][0] == pytest.approx(0.5)
    assert by["uniform_k32"]["ratio_to_reference"][2] == 0          # never reached it
    assert "the arm at its own group size" in report.format_arm(arm)


def test_a_run_records_its_buckets_shares_and_gains():
    history = [{"prompt_ids": ["a1", "a2", "s1"]}, {"prompt_ids": ["s1"]}]
    shares = testbed.bucket_shares_of(history, {"a1": "add1", "a2": "add1", "s1": "sub3"})
    assert shares == {"add1": 0.5, "sub3": 0.5}
    evals = [{"accuracy_by_bucket": {"add1": 0.5, "sub3": 0.2}}, {},
             {"accuracy_by_bucket": {"add1": 0.75, "sub3": 0.1}}]
    assert testbed.bucket_gains_of(evals) == {"add1": 0.25, "sub3": pytest.approx(-0.1)}


def test_the_chart_has_the_probe_panel_only_where_uniform_ran(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    width = {}
    for name, methods in (("with", ("ds", "uniform")), ("without", ("ds", "sara"))):
        runs = [_run(m, 0, [0.3, 0.4, 0.5]) for m in methods]
        assert report.chart(runs, tmp_path / f"{name}.png")
        width[name] = plt.imread(tmp_path / f"{name}.png").shape[1]
    assert width["without"] < width["with"]     # one panel (8 in) against two (13 in)


def test_at_ds_budget_reads_steps_and_group_price_where_ds_stopped():
    # _run: 1,000 rollouts and 10 steps an evaluation; DS stops at 2,000 (20 steps)
    protocol = {"batch_groups": 4}
    ds = _run("ds", 0, [0.4, 0.5, 0.6], protocol=protocol, trained={"groups": 80},
              groups_opened=400)
    sara = _run("sara", 0, [0.4, 0.5, 0.6, 0.7], protocol=protocol, trained={"groups": 150},
                groups_opened=1000, step=1000)
    sara["curve"][2]["steps"] = 25                # 25 steps at DS's 2,000 rollouts
    figures = report.at_ds_budget([ds, sara], "sara")
    assert figures["steps_x_ds"][0] == pytest.approx(25 / 20)
    assert figures["rollouts_per_group"][0] == pytest.approx(2000 / (4 * 25))
    assert figures["trained_share"][0] == pytest.approx(0.15)
    assert report.at_ds_budget([sara], "sara") == {}           # no DS run in its seed
    rows = report.format_at_ds_budget([ds, sara]).splitlines()
    assert rows[3].split()[:4] == ["ds", "1.00", "±", "0.00"]
    assert rows[4].split()[:2] == ["sara", "1.25"]
