"""The synthetic arithmetic task: determinism, reversed answers, rewards, held-out split."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
from sara_demo.tasks import arith, get_task, score
from sara_demo.tasks.arith import (
    BUCKET_NAMES,
    BUCKETS,
    make_eval_set,
    make_split,
    parse_completion,
    reward,
    training_pairs,
)

ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")  # the service's Identifier


def test_ten_buckets_of_the_right_kinds():
    assert BUCKET_NAMES == ("add1", "add2", "add3", "add4", "sub1", "sub2", "sub3",
                            "mul1", "mul2", "mul3")
    assert len(BUCKETS) == 10


def test_make_split_is_deterministic_and_seeded():
    a = make_split(300, seed=1)
    assert a == make_split(300, seed=1)
    assert a != make_split(300, seed=2)
    assert len({p["id"] for p in a}) == 300


def test_split_covers_every_bucket_evenly_with_operands_of_the_right_size():
    prompts = make_split(1000, seed=0)
    counts = Counter(p["meta"]["bucket"] for p in prompts)
    assert set(counts) == set(BUCKET_NAMES)
    for p in prompts:
        a, op, b = arith.parse_prompt(p["prompt"])
        bucket = arith.get_bucket(p["meta"]["bucket"])
        assert op == bucket.op
        assert len(str(a)) == bucket.digits and len(str(b)) == bucket.second_digits
        if op == "-":
            assert a >= b
        assert arith.bucket_of(p["prompt"]) == bucket.name
    # small buckets give all they have, the rest share the remainder evenly
    big = [counts[b] for b in ("add2", "add3", "add4", "sub3", "mul3")]
    assert max(big) - min(big) <= 1


def test_prompt_shape_matches_the_service_and_the_worker_verifier():
    for p in make_split(50, seed=3):
        assert set(p) == {"id", "prompt", "answer", "task", "meta"}
        assert p["task"] == "arith" and ID_PATTERN.match(p["id"])
        assert p["meta"] == {"bucket": p["meta"]["bucket"], "reversed_answer": True}
        assert re.fullmatch(r"\d+[+\-*]\d+=", p["prompt"])
    try:
        from sara_client.models import PromptIn
    except ImportError:  # pragma: no cover
        return
    PromptIn.model_validate(make_split(1, seed=0)[0])


def test_completions_are_reversed_and_answers_plain():
    assert arith.Problem(12, "+", 345, "add3").completion == "753"
    assert arith.Problem(12, "+", 345, "add3").answer == "357"
    assert arith.Problem(100, "-", 1, "sub3").completion == "99"
    assert arith.Problem(25, "*", 4, "mul2").completion == "001"
    assert arith.target_completion("25*4=") == "001"
    assert arith.reverse_answer(-12) == "21-"
    for prompt in make_split(200, seed=4):
        a, op, b = arith.parse_prompt(prompt["prompt"])
        assert int(prompt["answer"]) == arith.evaluate(a, op, b)
        target = arith.target_completion(prompt["prompt"])
        assert target == prompt["answer"][::-1]
        assert reward(target, prompt["prompt"]) == 1.0


def test_reward():
    assert reward("753", "12+345=") == 1.0
    assert reward("753<eos>", "12+345=") == 1.0
    assert reward("753<eos>9", "12+345=") == 1.0     # nothing after eos counts
    assert reward(" 753 ", "12+345=") == 1.0
    assert reward("7530", "12+345=") == 1.0          # trailing zero = a leading zero: 357
    assert reward("357", "12+345=") == 0.0            # not reversed
    assert reward("754", "12+345=") == 0.0
    assert reward("001", "25*4=") == 1.0
    assert reward("0", "5-5=") == 1.0
    for bad in ("", " ", "abc", "75 3", "7a53", "-753", "<eos>753", "75.3"):
        assert reward(bad, "12+345=") == 0.0, bad
    assert reward("753", "hello") == 0.0
    assert reward("753", {"prompt": "12+345="}) == 1.0
    assert parse_completion("21-") == -12
    assert parse_completion(None) is None


def test_reward_agrees_with_the_worker_verifier_on_well_formed_completions():
    verifiers = pytest.importorskip("sara_worker.verifiers.arith")
    rng = random.Random(0)
    for prompt in make_split(300, seed=5):
        right = arith.target_completion(prompt["prompt"])
        wrong = str(int(prompt["answer"]) + rng.randint(1, 9))[::-1]
        for completion in (right, wrong, right + "0", prompt["answer"], "", "x"):
            assert verifiers.arith(completion, prompt["answer"], prompt["meta"]) == \
                reward(completion, prompt["prompt"]), (prompt, completion)
            assert score(prompt, completion) == reward(completion, prompt)


def test_eval_set_is_disjoint_from_every_training_split():
    evals = make_eval_set(1000, seed=0)
    eval_prompts = {p["prompt"] for p in evals}
    assert len(eval_prompts) == 1000
    assert set(Counter(p["meta"]["bucket"] for p in evals)) == set(BUCKET_NAMES)
    for seed in (0, 1, 2):
        train = make_split(2000, seed=seed)
        assert not eval_prompts & {p["prompt"] for p in train}
    stream = training_pairs(seed=0)
    assert not eval_prompts & {next(stream)[0] for _ in range(20_000)}
    assert make_eval_set(1000, seed=0) == evals


def test_training_pairs_are_deterministic_and_cover_all_buckets():
    first = [next(s) for s in [training_pairs(7)] for _ in range(500)]
    again = training_pairs(7)
    assert first == [next(again) for _ in range(500)]
    assert {arith.bucket_of(p) for p, _ in first} == set(BUCKET_NAMES)
    for prompt, answer in first:
        assert reward(answer, prompt) == 1.0


def test_buckets_subset_and_errors():
    only = make_split(50, seed=0, buckets=["add1", "mul3"])
    assert {p["meta"]["bucket"] for p in only} == {"add1", "mul3"}
    with pytest.raises(ValueError, match="unknown arith bucket"):
        make_split(5, seed=0, buckets=["div9"])
    with pytest.raises(ValueError, match="hold only"):
        make_split(10_000, seed=0, buckets=["add1"])
    with pytest.raises(ValueError, match="unknown task"):
        get_task("chess")
    assert get_task("arith") is arith


# --- imperfect demonstrations (the demo's warm start) -------------------------------------------


@pytest.mark.parametrize(("a", "op", "b", "slipped"), [
    (58, "+", 67, "52"),      # 125: the carried 1 is dropped
    (47, "*", 8, "67"),       # 376 -> 76
    (50, "+", 50, "00"),      # 100 -> "00", which reads as 0
    (12, "+", 345, "753"),    # 357: no final carry, nothing to drop
    (52, "-", 17, "53"),      # subtraction never slips
    (3, "*", 3, "9"),
])
def test_dropped_carry_forgets_only_the_final_carry_digit(a, op, b, slipped):
    assert arith.dropped_carry(a, op, b) == slipped
    prompt = f"{a}{op}{b}="
    correct = arith.target_completion(prompt)
    assert reward(correct, prompt) == 1.0
    # a slip is never rewarded, and a problem without a final carry has no slip
    assert reward(slipped, prompt) == float(slipped == correct)


def test_flawed_demonstrations_slip_at_the_given_share_and_only_in_their_buckets():
    stream = training_pairs(3, buckets=["add2", "sub2"], flawed={"add2": 0.6})
    slipped = Counter()
    carrying = Counter()
    for prompt, completion in (next(stream) for _ in range(6000)):
        a, op, b = arith.parse_prompt(prompt)
        bucket = "add2" if op == "+" else "sub2"
        if arith.dropped_carry(a, op, b) != arith.target_completion(prompt):
            carrying[bucket] += 1
            slipped[bucket] += completion != arith.target_completion(prompt)
        else:
            assert completion == arith.target_completion(prompt)
    share = slipped["add2"] / carrying["add2"]
    assert 0.55 < share < 0.65, share
    assert slipped["sub2"] == 0
    with pytest.raises(ValueError, match="unknown arith buckets"):
        next(training_pairs(0, flawed={"div9": 0.5}))
