"""Verifiers: each on good, wrong and malformed completions; none ever raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sara_worker import verifiers
from sara_worker.verifiers import UnknownVerifier, get, register, score
from sara_worker.verifiers.arith import arith, final_integer
from sara_worker.verifiers.countdown import check, expression_of

BUILTIN = ("exact", "arith", "countdown", "math", "sim")
COUNTDOWN = {"numbers": [3, 5, 7, 2], "target": 29}


# --- registry ------------------------------------------------------------------------------------


def test_builtins_resolve_lazily_and_are_listed():
    assert set(BUILTIN) <= set(verifiers.available())
    for name in BUILTIN:
        assert callable(get(name))
    assert verifiers.is_blocking("math") and not verifiers.is_blocking("exact")


def test_register_decorator_and_unknown_name():
    @register("test-always-half")
    def half(completion, answer, meta):
        return 0.5

    assert get("test-always-half") is half
    assert score("test-always-half", "x", None, {}) == 0.5
    with pytest.raises(UnknownVerifier, match="no-such-task"):
        get("no-such-task")
    assert score("no-such-task", "x", "x", {}) == 0.0


def test_score_turns_errors_and_non_finite_rewards_into_zero():
    @register("test-raises")
    def boom(completion, answer, meta):
        raise RuntimeError("broken verifier")

    @register("test-nan")
    def nan(completion, answer, meta):
        return float("nan")

    assert score("test-raises", "x", "x", {}) == 0.0
    assert score("test-nan", "x", "x", {}) == 0.0
    assert score("exact", None, "x", None) == 0.0  # wrong types are malformed input, not a crash


def test_entry_point_plugins_load_by_name(monkeypatch):
    class FakeEntryPoint:
        name = "test-plugin"

        def load(self):
            return lambda completion, answer, meta: float(completion == "yes")

    def fake_entry_points(group):
        assert group == "sara.verifiers"
        return [FakeEntryPoint()]

    monkeypatch.setattr(verifiers, "entry_points", fake_entry_points)
    assert "test-plugin" in verifiers.available()
    assert score("test-plugin", "yes", None, {}) == 1.0
    assert score("test-plugin", "no", None, {}) == 0.0


# --- exact ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("completion,answer,reward", [
    ("42", "42", 1.0),
    ("  42\n", "42", 1.0),
    ("hello   world", "hello world", 1.0),
    ("hello\n\tworld ", " hello world", 1.0),
    ("43", "42", 0.0),
    ("Hello world", "hello world", 0.0),
    ("", "42", 0.0),
    ("42", None, 0.0),
])
def test_exact(completion, answer, reward):
    assert score("exact", completion, answer, {}) == reward


# --- sim -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("completion,reward", [
    ("<sim reward=1>", 1.0), ("<sim reward=0>", 0.0), ("<sim aborted>", 0.0),
    ("<sim error=prompt has no meta.p_success>", 0.0), ("", 0.0), ("<sim reward=7>", 0.0),
])
def test_sim(completion, reward):
    assert score("sim", completion, None, {}) == reward


# --- arith ---------------------------------------------------------------------------------------


# The whole completion (up to <eos>) is the answer: the one arith rule (the demo task uses it).
@pytest.mark.parametrize("completion,answer,meta,reward", [
    ("46", "46", {}, 1.0),
    (" 46 ", "46", {}, 1.0),
    ("46<eos>junk", "46", {}, 1.0),
    ("-5", "-5", {}, 1.0),
    ("12+34=46", "46", {}, 0.0),
    ("The answer is 46.", "46", {}, 0.0),
    ("a46", "46", {}, 0.0),
    ("64", "46", {"reversed_answer": True}, 1.0),
    ("64<eos>", "46", {"reversed_answer": True}, 1.0),
    ("046", "640", {"reversed_answer": True}, 1.0),
    ("5-", "-5", {"reversed_answer": True}, 1.0),
    ("-5", "-5", {"reversed_answer": True}, 0.0),
    ("a5", "5", {"reversed_answer": True}, 0.0),
    ("12+34=64", "46", {"reversed_answer": True}, 0.0),
    ("46", "46", {"reversed_answer": True}, 0.0),
    ("forty-six", "46", {}, 0.0),
    ("", "46", {}, 0.0),
    ("46", "not a number", {}, 0.0),
    ("46", None, {}, 0.0),
    ("9" * 5000, "9", {}, 0.0),
])
def test_arith(completion, answer, meta, reward):
    assert score("arith", completion, answer, meta) == reward


def test_final_integer_reads_the_whole_completion_only():
    assert final_integer("333") == 333
    assert final_integer("a 1 b 22 c 333") is None
    assert final_integer("123", reversed_digits=True) == 321
    assert final_integer("no digits") is None


def test_arith_agrees_with_the_demo_tasks_reward():
    """Worker and demo task must score every completion alike: junk included."""
    task_arith = pytest.importorskip("sara_demo.tasks.arith")
    for problem in task_arith.make_split(60, seed=3):
        truth = problem["answer"]
        candidates = [problem_completion for problem_completion in (
            truth[::-1], truth[::-1] + "<eos>", "a" + truth[::-1], truth, truth[::-1] + " 7",
            "", "0", "-" + truth[::-1], truth[::-1] + "-")]
        for completion in candidates:
            assert arith(completion, truth, problem["meta"]) == task_arith.reward(
                completion, problem["prompt"]), (problem["prompt"], completion)


# --- countdown -----------------------------------------------------------------------------------


@pytest.mark.parametrize("completion,reward", [
    ("<answer>(3 + 5) * 2 + 7 + 6</answer>", 0.0),         # 6 is not given
    ("<answer>3 * 5 + 7 * 2</answer>", 1.0),               # 15 + 14 = 29
    ("Let me think.\n3 * 5 + 7 * 2", 1.0),                 # last line
    ("3 * 5 + 7 * 2 = 29", 1.0),                           # '= target' ignored
    ("<answer>3 × 5 + 7 × 2</answer>", 1.0),               # unicode operators
    ("<answer>(7 - 5) / (3 - 3) + 29</answer>", 0.0),      # division by zero, and 3 reused
    ("<answer>3 * 5 + 7 * 2 + 0</answer>", 0.0),           # 0 not given
    ("<answer>3 * 5 + 7 * 2 * 1</answer>", 0.0),
    ("<answer>3 + 5 + 7 + 2</answer>", 0.0),               # 17, not 29
    ("<answer>3 * 3 + 5 * 2 + 7 + 3</answer>", 0.0),       # 3 used three times
    ("<answer></answer>", 0.0),
    ("no expression here", 0.0),
    ("", 0.0),
])
def test_countdown(completion, reward):
    assert score("countdown", completion, None, COUNTDOWN) == reward


def test_countdown_rational_arithmetic_and_target_from_answer():
    # (7 / 2) * (5 + 3) = 28 exactly only with rationals; 3.5 * 8 = 28
    meta = {"numbers": [7, 2, 5, 3]}
    assert score("countdown", "<answer>7 / 2 * (5 + 3)</answer>", "28", meta) == 1.0
    assert score("countdown", "<answer>7 / 2</answer>", "3", meta) == 0.0  # 3.5 is not 3


def test_countdown_number_reuse_and_duplicates():
    assert check("3 + 3", [3, 5], 6) is False          # 3 given once, used twice
    assert check("3 + 3", [3, 3, 5], 6) is True        # given twice: each may be used once
    assert check("3 + 5", [3, 5, 7], 8) is True        # at most once: 7 may stay unused
    assert check("3 + 5", [3, 5, 7], 8, use_all=True) is False
    assert check("3 + 5 - 7 + 7", [3, 5, 7, 7], 8, use_all=True) is True


@pytest.mark.parametrize("attack", [
    "__import__('os').system('echo pwned')",
    "open('/etc/passwd').read()",
    "(lambda: 29)()",
    "[29][0]",
    "29 if True else 0",
    "3 ** 5",
    "-3 + 32",
    "29.0",
    "True + 28",
    "'29'",
    "3; 29",
    "x",
    "(" * 300 + "29" + ")" * 300,
    "1+" * 2000 + "1",
])
def test_countdown_rejects_anything_but_integer_arithmetic(attack):
    meta = {"numbers": [3, 5, 29, 32, 28, 1, 0], "target": 29}
    assert score("countdown", f"<answer>{attack}</answer>", None, meta) == 0.0


@pytest.mark.parametrize("meta", [{}, {"numbers": "3 5"}, {"numbers": [3, "x"], "target": 3},
                                  {"numbers": [3], "target": None}, {"numbers": [], "target": 3},
                                  {"numbers": [3, True], "target": 4}])
def test_countdown_malformed_meta_scores_zero(meta):
    assert score("countdown", "<answer>3</answer>", None, meta) == 0.0


def test_expression_of_prefers_the_last_answer_tag():
    text = "<answer>1 + 1</answer> more thinking <answer> 3 * 5 </answer>\nignored"
    assert expression_of(text) == "3 * 5"


# --- math ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("completion,answer,reward", [
    ("So the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac12}", "1/2", 1.0),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\boxed{x(x+2)}", "x^2+2x", 1.0),
    ("The final answer is 10.", "10", 1.0),
    ("\\boxed{3}", "2", 0.0),
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", 0.0),
    ("garbage }}{{\\boxed{", "3", 0.0),
    ("", "3", 0.0),
    ("\\boxed{3}", None, 0.0),
    ("\\boxed{3}", "", 0.0),
])
def test_math(completion, answer, reward):
    assert score("math", completion, answer, {}) == reward


@pytest.mark.anyio
async def test_math_works_off_the_main_thread():
    import asyncio

    got = await asyncio.to_thread(score, "math", "\\boxed{\\frac{3}{4}}", "0.75", {})
    assert got == 1.0


# --- nothing raises ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["exact", "arith", "countdown", "sim"])
@settings(max_examples=150, deadline=None)
@given(completion=st.text(max_size=300), answer=st.one_of(st.none(), st.text(max_size=20)))
def test_arbitrary_text_never_raises(name, completion, answer):
    meta = {"numbers": [1, 2, 3, 4], "target": 10, "reversed_answer": True}
    fn = get(name)
    reward = fn(completion, answer, meta)  # the verifier itself, not the safety net
    assert reward in (0.0, 1.0)


@settings(max_examples=25, deadline=None)
@given(completion=st.text(alphabet=st.sampled_from("0123456789+-*/()\\{}boxedfrac ^x$"),
                          max_size=60))
def test_math_arbitrary_text_never_raises(completion):
    assert get("math")(completion, "1/2", {}) in (0.0, 1.0)


@settings(max_examples=150, deadline=None)
@given(expr=st.text(alphabet=st.sampled_from("0123456789+-*/() ._xa=<>"), max_size=80))
def test_countdown_arbitrary_expressions_never_raise(expr):
    assert get("countdown")(f"<answer>{expr}</answer>", None, COUNTDOWN) in (0.0, 1.0)


def test_sim_draws_untagged_completions_from_p_success():
    """A real engine's text carries no sim tag: the reward is Bernoulli(meta.p_success)."""
    from sara_worker.sim import verifier as sim

    sim.seed(7)
    draws = [score("sim", "any text a model wrote", None, {"p_success": 0.3})
             for _ in range(4000)]
    assert set(draws) == {0.0, 1.0}
    assert abs(sum(draws) / len(draws) - 0.3) < 0.03   # 4.4 standard errors
    assert all(score("sim", "text", None, {"p_success": 1.0}) == 1.0 for _ in range(50))
    assert all(score("sim", "text", None, {"p_success": 0.0}) == 0.0 for _ in range(50))
    sim.seed(7)
    assert [score("sim", "x", None, {"p_success": 0.3}) for _ in range(4000)] == draws


@pytest.mark.parametrize("meta", [{}, {"p_success": "0.5"}, {"p_success": 1.5},
                                  {"p_success": float("nan")}, {"p_success": True}])
def test_sim_without_a_usable_p_success_scores_zero(meta):
    assert score("sim", "untagged", None, meta) == 0.0


@pytest.mark.parametrize("completion", ["<sim aborted>", "<sim error=boom>"])
def test_sim_backend_endings_are_not_drawn(completion):
    assert score("sim", completion, None, {"p_success": 1.0}) == 0.0
