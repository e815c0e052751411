"""The strategies behind the scheduler: every setting value has its object, each object keeps its
interface, and the scheduler dispatches without branching on strategy names."""

from __future__ import annotations

import ast
import json
import random
import typing
from pathlib import Path

import pytest

from sara_service.core.allocators import ALLOCATORS, allocator_for
from sara_service.core.planning import Planner
from sara_service.core.selections import SELECTIONS
from sara_service.core.sizing import SIZINGS, sizing_for
from sara_service.settings import INTERNAL_SETTINGS, AllocationPolicy, SelectionPolicy, Settings
from sara_service.store.codec import decode_posterior

SCHEDULER = Path(__file__).resolve().parents[2] / "service/sara_service/core/scheduler.py"
# settings that name a strategy; the scheduler may compare at most STRATEGY_BRANCHES of them
STRATEGY_FIELDS = {"policy", "selection", "group_sizing", "prior", "effective", "tau_low",
                   "selection_rank", "commit"}
STRATEGY_BRANCHES = 3


def test_every_setting_value_has_its_strategy():
    assert set(ALLOCATORS) == set(typing.get_args(AllocationPolicy))
    assert set(SELECTIONS) == set(typing.get_args(SelectionPolicy))
    sizing_values = typing.get_args(Settings.model_fields["group_sizing"].annotation)
    assert set(SIZINGS) == set(sizing_values)


def _strategy_comparisons(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
            if STRATEGY_FIELDS & set(names):
                lines.append(node.lineno)
    return lines


def test_the_scheduler_does_not_branch_on_strategy_names():
    tree = ast.parse(SCHEDULER.read_text())
    found = _strategy_comparisons(tree)
    assert len(found) <= STRATEGY_BRANCHES, f"strategy comparisons at lines {found}"
    # the walk finds one when there is one
    probe = ast.parse("if self.settings.selection == 'dps':\n    pass\n")
    assert _strategy_comparisons(probe) == [1]


def test_the_scheduler_stays_under_450_lines():
    assert len(SCHEDULER.read_text().splitlines()) <= 450


def _result(reward: float) -> bytes:
    return json.dumps({"reward": reward}).encode()


def test_reinforce_ada_delivers_its_kept_rollouts_with_every_reward():
    settings = Settings(policy="reinforce_ada", group_size=8, ada_round=4, ada_keep=4,
                        ada_rule="balanced")
    ada = allocator_for(settings)
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    kept, drawn = ada.delivered([_result(r) for r in rewards])
    assert len(kept) == 4 and drawn == rewards
    assert ada.commit == "partial"


def test_the_plain_policies_deliver_as_they_stand_and_commit_as_set():
    for policy in ("uniform", "dynamic_sampling", "sara"):
        allocator = allocator_for(Settings(policy=policy, commit="partial"))
        results = [_result(1.0), _result(0.0)]
        assert allocator.delivered(results) == (results, None)
        assert allocator.commit == "partial"
        assert allocator.prices_by_tau == (policy == "sara")


def test_pilot_commit_fills_to_k_and_excludes_a_solved_pilot():
    pc = allocator_for(Settings(policy="pilot_commit", group_size=16, pc_pilot=4))
    assert pc.commit == "complete" and pc.reads_history
    solved = decode_posterior(json.dumps({"a": 5, "b": 1, "obs": [[0, "S"]]}))
    fresh = decode_posterior(json.dumps({"a": 1, "b": 1}))
    assert pc.excludes(solved) and not pc.excludes(fresh)
    kept_on = allocator_for(Settings(policy="pilot_commit", group_size=16, pc_pilot=4,
                                     pc_exclude_solved=False))
    assert not kept_on.excludes(solved) and not kept_on.reads_history


def test_var_k_splits_a_draw_and_fixed_plans_each_prompt():
    settings = Settings(policy="sara", group_sizing="var_k", group_size=8, vk_batch=4,
                        prior="history")
    planner = Planner(settings, allocator_for(settings))
    posts = [decode_posterior(json.dumps({"a": 1 + i, "b": 4 - i})) for i in range(4)]
    drawn = [(f"p{i}", post) for i, post in enumerate(posts)]
    var_k = sizing_for(settings, planner)
    plans, skipped = var_k.plans(drawn, 0, 0.0)
    assert skipped == 0 and [pid for pid, _ in plans] == ["p0", "p1", "p2", "p3"]
    assert sum(plan.k for _, plan in plans) == 4 * 8   # the draw's budget, split
    assert var_k.draw_count(1, 1, 100) == 4 and var_k.reads_history
    fixed = SIZINGS["fixed"](Settings(policy="sara", group_size=8), planner)
    assert fixed.draw_count(20, 4, 100) == 5 and fixed.draw_count(1000, 4, 16) == 16


@pytest.mark.parametrize("name", sorted(SELECTIONS))
def test_a_selection_reads_history_unless_it_is_epoch_order(name):
    settings = Settings(selection=name)
    selection = SELECTIONS[name](settings, store=None, planner=None, rng=random.Random(0))
    assert selection.reads_history == (name != "epoch")


def test_a_peers_settings_are_declared_with_it_and_shown_as_its_group():
    from sara_service.setting_groups import SETTING_GROUPS

    groups = {g.key: set(g.fields) for g in SETTING_GROUPS}
    strategies = {"reinforce_ada": ALLOCATORS["reinforce_ada"],
                  "pilot_commit": ALLOCATORS["pilot_commit"], "dps": SELECTIONS["dps"],
                  "mopps": SELECTIONS["mopps"], "greso": SELECTIONS["greso"]}
    for key, strategy in strategies.items():
        declared = set(strategy.settings_class.model_fields) - INTERNAL_SETTINGS
        assert declared == groups[key], key
    # var_k's group also holds the switch that picks it (SARA_GROUP_SIZING)
    assert set(SIZINGS["var_k"].settings_class.model_fields) == groups["var_k"]
    assert ALLOCATORS["sara"].settings_class is None
