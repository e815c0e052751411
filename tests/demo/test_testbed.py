"""The learning testbed's task pieces: the habits' slips, the demonstration stream, the shipped
warm start and the three splits."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from sara_demo import testbed
from sara_demo.tasks.arith import parse_completion, reward


def test_no_borrow_takes_the_smaller_digit_from_the_larger():
    assert testbed.no_borrow(52, 17) == "54"        # 45, not 35
    assert testbed.no_borrow(35, 12) == "32"        # no borrow needed: the right answer, 23
    assert testbed.no_borrow(91, 19) == "88"
    assert testbed.no_borrow(7, 7) == "0"
    for a, b in ((52, 17), (300, 1), (61, 9)):      # every borrow problem gets a wrong answer
        assert reward(testbed.no_borrow(a, b), f"{a}-{b}=") == 0.0
    assert reward(testbed.no_borrow(35, 12), "35-12=") == 1.0


def test_each_operator_slips_its_own_way():
    assert testbed.slipped(58, "+", 67) == "52"     # the final carry dropped
    assert testbed.slipped(47, "*", 8) == "67"
    assert testbed.slipped(52, "-", 17) == "54"
    assert parse_completion(testbed.slipped(12, "+", 3)) == 15   # nothing to drop


def test_demonstrations_slip_at_each_buckets_share():
    pairs = list(itertools.islice(testbed.habit_pairs(0, {"sub2": 0.9, "add1": 0.0}), 20_000))
    slips, borrows = Counter(), Counter()
    for prompt, completion in pairs:
        a, b = (int(x) for x in prompt[:-1].split("-")) if "-" in prompt else (0, 0)
        sub2 = "-" in prompt and 10 <= b <= a <= 99
        if sub2 and testbed.no_borrow(a, b) != str(a - b)[::-1]:
            borrows["sub2"] += 1
            slips["sub2"] += reward(completion, prompt) == 0.0
        elif "+" in prompt:
            assert reward(completion, prompt) == 1.0   # no habit: always right
    assert slips["sub2"] / borrows["sub2"] == pytest.approx(0.9, abs=0.04)
    with pytest.raises(ValueError, match="unknown arith buckets"):
        next(testbed.habit_pairs(0, {"div2": 0.5}))


def test_the_shipped_warm_start_is_the_recipes_and_verified():
    directory = testbed.verified_testbed()
    manifest = json.loads((directory / "warmstart.json").read_text())
    assert manifest["recipe"]["habits"] == testbed.HABITS
    assert manifest["recipe"]["steps"] == testbed.TestbedRecipe().steps
    assert 0.2 < manifest["heldout_greedy_accuracy"] < 0.6   # room to learn, not a blank start
    assert set(manifest["sha256"]) >= {"model.safetensors", "config.json", "tokenizer.json"}


def test_splits_are_disjoint_and_the_pool_spreads_over_the_buckets():
    pool = testbed.training_pool(1000, seed=0)
    assert len({p["id"] for p in pool}) == len(pool) >= 900
    counts = Counter(p["meta"]["bucket"] for p in pool)
    assert len(counts) == 10 and max(counts.values()) == 100
    validation = testbed.validation_set(500, pool)
    test = testbed.test_set(500)
    ids = [{p["id"] for p in s} for s in (pool, validation, test)]
    assert len(validation) == 500 and not ids[0] & ids[1] and not ids[2] & (ids[0] | ids[1])
    assert testbed.training_pool(1000, seed=0) == pool            # seeded
    assert testbed.training_pool(1000, seed=1) != pool


def test_the_rebuild_command_takes_only_known_habit_sets(tmp_path, capsys):
    assert testbed.SHIPPED_HABITS in testbed.HABIT_SETS
    assert testbed.HABITS == testbed.HABIT_SETS[testbed.SHIPPED_HABITS]
    with pytest.raises(SystemExit):
        testbed.main(["--out", str(tmp_path), "--habits", "nope"])
    assert "invalid choice" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())   # refused before anything was built
