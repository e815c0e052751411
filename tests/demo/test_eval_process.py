"""Evaluations in a child process (sara_demo.eval_process): the same figures as on the caller's
thread, the weights as they were when submitted, and a child that cannot start is an error, not
a wait."""

from __future__ import annotations

import concurrent.futures

import pytest

torch = pytest.importorskip("torch")

from sara_demo.eval_process import PolicyEvaluator  # noqa: E402
from sara_demo.evaluate import greedy_accuracy, group_kinds  # noqa: E402
from sara_demo.tasks.arith import make_eval_set  # noqa: E402
from sara_demo.testbed import training_pool, verified_testbed  # noqa: E402


@pytest.fixture(scope="module")
def start():
    return str(verified_testbed())


@pytest.fixture(scope="module")
def splits():
    return make_eval_set(60, seed=0), training_pool(200, 0)[:12]


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
def test_the_childs_figures_are_those_of_the_callers_thread(start, splits):
    from sara_trainer.policy import load_policy

    judged, probe = splits
    model, tokenizer = load_policy(start)
    with PolicyEvaluator(start, judged, probe, k=4) as evaluator:
        apart = evaluator.submit(model, generator_seed=7).result(timeout=120)
    here = greedy_accuracy(model, tokenizer, judged)
    kinds = group_kinds(model, tokenizer, probe, k=4, generator=torch.Generator().manual_seed(7))
    assert apart == {"accuracy": here["accuracy"], "n": 60, "by_bucket": here["by_bucket"],
                     "counts": here["counts"], "kinds": kinds}
    assert sum(apart["counts"].values()) == 60
    assert set(kinds) <= {"all_fail", "mixed", "all_success"} and len(kinds) == 12


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
def test_the_weights_are_copied_when_submitted(start, splits):
    from sara_trainer.policy import load_policy

    judged, probe = splits
    model, tokenizer = load_policy(start)
    with PolicyEvaluator(start, judged, probe, k=2) as evaluator:
        first = evaluator.submit(model, generator_seed=0)
        with torch.no_grad():   # the trainer goes on changing them right after
            for p in model.parameters():
                p.zero_()
        zeroed = evaluator.submit(model, generator_seed=0)
        first, zeroed = first.result(timeout=120), zeroed.result(timeout=120)
    assert first["accuracy"] > 0.2            # the warm start's, not the zeroed model's
    assert zeroed["accuracy"] == 0.0
    assert first["accuracy"] == greedy_accuracy(*load_policy(start), judged)["accuracy"]


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
def test_a_child_that_cannot_start_fails_the_evaluation(tmp_path, splits, start):
    from sara_trainer.policy import load_policy

    model, _ = load_policy(start)
    evaluator = PolicyEvaluator(str(tmp_path / "missing"), *splits, k=2)
    try:
        pending = evaluator.submit(model, generator_seed=0)
        with pytest.raises(concurrent.futures.process.BrokenProcessPool):
            pending.result(timeout=120)
    finally:
        evaluator.close()


def test_greedy_accuracy_decoded_by_prompt_length_scores_each_problem_as_given(start):
    from sara_demo.tasks import score
    from sara_demo.testbed import test_set
    from sara_trainer.policy import load_policy, sample

    model, tokenizer = load_policy(start)
    judged = test_set(300)[::-1]
    got = greedy_accuracy(model, tokenizer, judged, batch_size=32)
    given = sample(model, tokenizer, judged, k=1, max_new_tokens=8, temperature=0,
                   batch_size=32).completions
    hits = [score(p, c) for p, c in zip(judged, given)]
    assert 0.1 < sum(hits) / len(hits) < 0.9   # right and wrong answers both, to be placed
    assert got["accuracy"] == pytest.approx(sum(hits) / len(hits))
    for bucket, n in got["counts"].items():
        mine = [h for p, h in zip(judged, hits) if p["meta"]["bucket"] == bucket]
        assert n == len(mine) and got["by_bucket"][bucket] == pytest.approx(sum(mine) / n)
