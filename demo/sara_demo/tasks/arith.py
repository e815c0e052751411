"""``arith``: a synthetic verifiable task with graded difficulty, answers written in reverse.

Ten buckets, easiest first::

    add1 add2 add3 add4   a+b, both operands with 1..4 digits
    sub1 sub2 sub3        a-b, both operands with 1..3 digits, a >= b (never negative)
    mul1 mul2 mul3        a*b, a with 1..3 digits, b one digit

A prompt is ``"12+345="``; the completion is the result's digits least significant first followed
by the end-of-sequence token: 12+345 = 357, so the target completion is ``"753"`` + ``<eos>``.
Reversed digits let a left-to-right model produce each digit after the carry that decides it.

The held-out evaluation problems are fixed by a hash of the problem itself (about one in eight of
every bucket's problems), not by a seed, so an evaluation set drawn with any seed never shares a
problem with a training set drawn with any other seed (``split="train"`` vs ``split="eval"``).

The service's ``PromptIn`` shape, which the worker's ``arith`` verifier reads the same way::

    {"id": "arith-add3-12-345", "prompt": "12+345=", "answer": "357", "task": "arith",
     "meta": {"bucket": "add3", "reversed_answer": True}}

``answer`` is the true result in ordinary notation; ``meta.reversed_answer`` says the completion
writes it reversed. That is the worker verifier's contract (``sara_worker.verifiers.arith``: it
reverses the completion's digits, never the gold answer; its tests pin ``"64"`` right for answer
``"46"``), and :func:`reward` is that verifier: one rule for the worker and the demo. The
completion a correct model writes is :attr:`Problem.completion` / :func:`target_completion`.

Past 400 lines because the task is one definition: the buckets, the train/held-out split, the
problem generators and the reward all follow from the same rules and are read together.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sara_worker.verifiers.arith import arith as verify
from sara_worker.verifiers.arith import final_integer

TASK = "arith"
EOS = "<eos>"


@dataclass(frozen=True)
class Bucket:
    """One difficulty bucket: operator and the digit counts of the two operands."""

    name: str
    op: str          # "+", "-" or "*"
    digits: int      # digits of the first operand (and of the second for + and -)

    @property
    def second_digits(self) -> int:
        return 1 if self.op == "*" else self.digits

    def size(self) -> int:
        """How many distinct problems the bucket holds."""
        n1, n2 = _count(self.digits), _count(self.second_digits)
        if self.op == "-":
            # pairs a >= b with both operands in the same digit range
            return n1 * (n1 + 1) // 2
        return n1 * n2


BUCKETS: tuple[Bucket, ...] = (
    Bucket("add1", "+", 1), Bucket("add2", "+", 2), Bucket("add3", "+", 3), Bucket("add4", "+", 4),
    Bucket("sub1", "-", 1), Bucket("sub2", "-", 2), Bucket("sub3", "-", 3),
    Bucket("mul1", "*", 1), Bucket("mul2", "*", 2), Bucket("mul3", "*", 3),
)
BUCKET_NAMES: tuple[str, ...] = tuple(b.name for b in BUCKETS)
_BY_NAME = {b.name: b for b in BUCKETS}
_OP_NAMES = {"+": "add", "-": "sub", "*": "mul"}
_PROMPT = re.compile(r"^\s*(\d{1,9})\s*([+\-*])\s*(\d{1,9})\s*=\s*$")

# One problem in HELDOUT_MOD goes to the evaluation split (chosen by a stable hash).
HELDOUT_MOD = 8


def _count(digits: int) -> int:
    """Numbers with exactly `digits` digits (1 digit: 0..9)."""
    return 10 if digits == 1 else 9 * 10 ** (digits - 1)


def _low(digits: int) -> int:
    return 0 if digits == 1 else 10 ** (digits - 1)


def get_bucket(name: str) -> Bucket:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown arith bucket {name!r}; choose from {', '.join(BUCKET_NAMES)}") \
            from None


def resolve_buckets(buckets: Iterable[str | Bucket] | None) -> tuple[Bucket, ...]:
    """Bucket objects for names (None: all ten), in the order given, without repeats."""
    if buckets is None:
        return BUCKETS
    out: list[Bucket] = []
    for b in buckets:
        bucket = b if isinstance(b, Bucket) else get_bucket(b)
        if bucket not in out:
            out.append(bucket)
    if not out:
        raise ValueError("no buckets given")
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# problems


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int
    bucket: str

    @property
    def prompt(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def result(self) -> int:
        return evaluate(self.a, self.op, self.b)

    @property
    def answer(self) -> str:
        """The result in ordinary notation (the prompt's ``answer`` field)."""
        return str(self.result)

    @property
    def completion(self) -> str:
        """The reversed digits of the result: the completion a correct model writes (no eos)."""
        return reverse_answer(self.result)

    @property
    def id(self) -> str:
        return f"{TASK}-{self.bucket}-{self.a}-{self.b}"

    @property
    def heldout(self) -> bool:
        return is_heldout(self.a, self.op, self.b)

    def to_prompt(self) -> dict[str, Any]:
        """The service's PromptIn shape."""
        return {"id": self.id, "prompt": self.prompt, "answer": self.answer, "task": TASK,
                "meta": {"bucket": self.bucket, "reversed_answer": True}}


def evaluate(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def reverse_answer(value: int) -> str:
    """Digits least significant first; a negative number gets a trailing minus (``-12`` → ``21-``)."""
    text = str(abs(int(value)))[::-1]
    return text + "-" if value < 0 else text


def is_heldout(a: int, op: str, b: int) -> bool:
    """Whether the problem belongs to the evaluation split (stable across processes and seeds)."""
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELDOUT_MOD == 0


def random_problem(bucket: Bucket, rng: random.Random) -> Problem:
    """One problem of `bucket`, uniform over its problems (either split)."""
    a = rng.randint(_low(bucket.digits), 10 ** bucket.digits - 1)
    b = rng.randint(_low(bucket.second_digits), 10 ** bucket.second_digits - 1)
    if bucket.op == "-" and a < b:
        a, b = b, a
    return Problem(a, bucket.op, b, bucket.name)


def _bucket_problems(bucket: Bucket) -> Iterator[Problem]:
    """Every problem of a (small) bucket, in a fixed order."""
    for a in range(_low(bucket.digits), 10 ** bucket.digits):
        for b in range(_low(bucket.second_digits), 10 ** bucket.second_digits):
            if bucket.op == "-" and a < b:
                continue
            yield Problem(a, bucket.op, b, bucket.name)


def _in_split(problem: Problem, split: str) -> bool:
    if split == "train":
        return not problem.heldout
    if split == "eval":
        return problem.heldout
    if split == "all":
        return True
    raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")


def sample_problem(bucket: Bucket, rng: random.Random, split: str = "train") -> Problem:
    """One problem of `bucket` from `split`, by rejection (each bucket has both splits)."""
    while True:
        problem = random_problem(bucket, rng)
        if _in_split(problem, split):
            return problem


@functools.lru_cache(maxsize=64)
def _pool(bucket: Bucket, split: str) -> tuple[Problem, ...]:
    """Every problem of a small bucket in `split`, in a fixed order (cached)."""
    return tuple(p for p in _bucket_problems(bucket) if _in_split(p, split))


def split_size(bucket: Bucket | str, split: str) -> int:
    """Exact number of problems of a bucket in a split (enumerates: meant for small buckets)."""
    bucket = bucket if isinstance(bucket, Bucket) else get_bucket(bucket)
    if bucket.size() <= 20_000:
        return len(_pool(bucket, split))
    return sum(1 for p in _bucket_problems(bucket) if _in_split(p, split))


def _capacity(bucket: Bucket, split: str) -> int:
    """Problems of `bucket` in `split`: exact for small buckets, a safe lower bound for big ones."""
    if bucket.size() <= 20_000:
        return split_size(bucket, split)
    share = {"train": 1 - 1 / HELDOUT_MOD, "eval": 1 / HELDOUT_MOD, "all": 1.0}[split]
    return int(bucket.size() * share * 0.9)


def _distinct_from_bucket(bucket: Bucket, count: int, rng: random.Random, split: str
                          ) -> list[Problem]:
    """`count` distinct problems of `bucket` in `split` (fewer if the bucket has fewer)."""
    if bucket.size() <= 20_000:
        pool = list(_pool(bucket, split))
        rng.shuffle(pool)
        return pool[:count]
    seen: set[tuple[int, int]] = set()
    out: list[Problem] = []
    while len(out) < count:
        problem = sample_problem(bucket, rng, split)
        if (problem.a, problem.b) not in seen:
            seen.add((problem.a, problem.b))
            out.append(problem)
    return out


def make_problems(n: int, seed: int, buckets: Iterable[str | Bucket] | None = None,
                  split: str = "train") -> list[Problem]:
    """`n` distinct problems, spread as evenly as the buckets allow, in a seeded shuffled order.

    A bucket too small for its share (``add1`` has about 88 training problems) gives all it has
    and the others make up the difference; ValueError when the buckets together hold fewer than
    `n`. Same (n, seed, buckets, split) → same list, in any process.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    chosen = resolve_buckets(buckets)
    rng = random.Random(f"arith:{seed}:{split}:{','.join(b.name for b in chosen)}")
    capacity = {b.name: _capacity(b, split) for b in chosen}
    if sum(capacity.values()) < n:
        raise ValueError(f"the buckets {[b.name for b in chosen]} hold only "
                         f"{sum(capacity.values())} {split} problems; asked for {n}")
    # water-filling: equal shares, small buckets capped, the rest spread over the others
    quota = {b.name: 0 for b in chosen}
    remaining, open_ = n, [b.name for b in chosen]
    while remaining > 0:
        share, extra = divmod(remaining, len(open_))
        for i, name in enumerate(list(open_)):
            want = share + (1 if i < extra else 0)
            take = min(want, capacity[name] - quota[name])
            quota[name] += take
            remaining -= take
            if quota[name] >= capacity[name]:
                open_.remove(name)
        if not open_:
            break
    problems: list[Problem] = []
    for bucket in chosen:
        problems.extend(_distinct_from_bucket(bucket, quota[bucket.name], rng, split))
    rng.shuffle(problems)
    return problems


def make_split(n: int, seed: int, buckets: Iterable[str | Bucket] | None = None,
               split: str = "train") -> list[dict[str, Any]]:
    """`n` distinct prompts in the service's PromptIn shape (see the module doc).

    ``split="train"`` never contains a problem of ``split="eval"`` (see :func:`make_eval_set`).
    """
    return [p.to_prompt() for p in make_problems(n, seed, buckets, split)]


def make_eval_set(n: int, seed: int = 0, buckets: Iterable[str | Bucket] | None = None
                  ) -> list[dict[str, Any]]:
    """Held-out prompts: disjoint from every ``make_split(..., split="train")``."""
    return make_split(n, seed, buckets, split="eval")


def training_pairs(seed: int, buckets: Iterable[str | Bucket] | None = None,
                   weights: Sequence[float] | None = None,
                   flawed: Mapping[str, float] | None = None) -> Iterator[tuple[str, str]]:
    """An endless seeded stream of (prompt, target completion) training pairs (the completion is
    the reversed result, without eos), held-out problems excluded.

    `flawed` maps bucket names to the share of that bucket's demonstrations that carry the
    slip of :func:`dropped_carry` (imperfect demonstrations, as SFT data often has); the reward
    never accepts a slipped answer."""
    chosen = resolve_buckets(buckets)
    rng = random.Random(f"arith-pairs:{seed}")
    flawed = dict(flawed or {})
    unknown = sorted(set(flawed) - set(BUCKET_NAMES))
    if unknown:
        raise ValueError(f"unknown arith buckets in flawed: {unknown}")
    while True:
        bucket = rng.choices(chosen, weights=weights)[0] if weights else rng.choice(chosen)
        problem = sample_problem(bucket, rng, "train")
        share = flawed.get(bucket.name, 0.0)
        if share and rng.random() < share:
            yield problem.prompt, dropped_carry(problem.a, problem.op, problem.b)
        else:
            yield problem.prompt, problem.completion


def dropped_carry(a: int, op: str, b: int) -> str:
    """The completion with the final carry forgotten: when the result is longer than the longer
    operand (``58+67`` is 125, ``47*8`` is 376) its leading digit, which in the reversed notation
    is the completion's last, is left out (``"52"`` for 58+67, ``"67"`` for 47*8); otherwise the
    correct completion. Every other digit, carries included, is right."""
    text = reverse_answer(evaluate(a, op, b))
    if op in "+*" and len(str(evaluate(a, op, b))) > max(len(str(a)), len(str(b))):
        return text[:-1]
    return text


# ---------------------------------------------------------------------------------------------
# reward


def parse_prompt(prompt: str) -> tuple[int, str, int] | None:
    """(a, op, b) from ``"12+345="``; None when it is not an arith prompt."""
    match = _PROMPT.match(prompt)
    if not match:
        return None
    return int(match.group(1)), match.group(2), int(match.group(3))


def parse_completion(completion: str) -> int | None:
    """The integer a reversed completion writes, or None when malformed.

    The text up to the first ``<eos>`` (if any), spaces around it ignored, must be digits with at
    most a trailing minus sign (a reversed negative number): ``"753"`` → 357, ``"021"`` → 120,
    ``"21-"`` → -12. Anything else (empty, letters, two numbers, a leading minus) is malformed.
    The worker's verifier reads it (:func:`sara_worker.verifiers.arith.final_integer`).
    """
    if not isinstance(completion, str):
        return None
    return final_integer(completion, reversed_digits=True)


def reward(completion: str, prompt: str | Mapping[str, Any]) -> float:
    """1.0 iff the completion's reversed integer equals the prompt's true result, else 0.0.

    `prompt` is the prompt text (``"12+345="``) or a prompt dict with a ``prompt`` key. The rule is
    the worker's ``arith`` verifier's, given the true result as the answer: one rule for both.
    """
    text = prompt.get("prompt", "") if isinstance(prompt, Mapping) else prompt
    parsed = parse_prompt(str(text))
    if parsed is None:
        return 0.0
    return verify(completion, str(evaluate(*parsed)), {"reversed_answer": True})


def target_completion(prompt: str) -> str:
    """The correct completion text (reversed digits, no ``<eos>``) for an arith prompt."""
    parsed = parse_prompt(prompt)
    if parsed is None:
        raise ValueError(f"not an arith prompt: {prompt!r}")
    return reverse_answer(evaluate(*parsed))


def bucket_of(prompt: str | Mapping[str, Any]) -> str | None:
    """The bucket a prompt belongs to (from its meta, else from its text)."""
    if isinstance(prompt, Mapping):
        meta = prompt.get("meta") or {}
        if meta.get("bucket"):
            return str(meta["bucket"])
        prompt = str(prompt.get("prompt", ""))
    parsed = parse_prompt(prompt)
    if parsed is None:
        return None
    a, op, b = parsed
    digits = len(str(a))
    name = f"{_OP_NAMES[op]}{digits}"
    if name not in _BY_NAME:
        return None
    bucket = _BY_NAME[name]
    if len(str(b)) != bucket.second_digits:
        return None
    return name
