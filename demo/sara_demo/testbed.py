"""The learning testbed: arith with several bad habits of different strengths, so that RL keeps
learning for a hundred optimizer steps and more, and the allocator decides how fast.

Why habits: the demo's warm start has one shared slip (the dropped final carry), which RL removes
in a handful of steps; after that nothing is left to learn that RL can reach. Here the warm start
is the demo's shipped one taught, for ``steps`` more SFT steps, demonstrations that slip in
*different* ways and at *different* rates per bucket (:data:`HABITS`):

- ``carry``: the final carry digit left out (``arith.dropped_carry``), in addition up to three
  digits and in multiplication;
- ``borrow``: subtraction digit by digit without borrowing, smaller digit from larger
  (``52-17`` written as ``45``; :func:`no_borrow`).

A habit taught at share 0.5 is unlearnt in a few steps. The carry slip is unlearnt fast even at
0.99, because the skill it hides is one the policy can recover from rare successes in every
addition bucket at once; the borrow slip (0.99, 0.995) and the two-digit multiplier's carry
(0.995) go slowly, over a hundred steps and more, as the policy's own successes accumulate, and
most of their groups are all-fail meanwhile. The easy buckets stay solved (all-success groups)
and add4 / mul3, which the warm start barely knows, stay mostly all-fail: saturation on both
sides throughout, as on real math pools.

The three splits of the protocol (``bench/e2e.py --testbed``):

- **pool**: ``pool_size`` training prompts, every bucket equally (small buckets as many as they
  hold), revisited many times in a run;
- **validation**: training-split problems outside the pool, for choosing learning rates;
- **test**: the arith held-out split (``arith.make_eval_set``), never trained on or tuned on.

The warm start is shipped in ``assets/testbed/`` with its manifest (recipe, library versions,
SHA-256 of every file, greedy accuracy right after); rebuild it with
``python -m sara_demo.testbed --out demo/sara_demo/assets/testbed`` (about 75 s on 2 cores);
``--habits b`` rebuilds the warm start of the first recording.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .tasks.arith import (BUCKETS, dropped_carry, make_eval_set, make_split, resolve_buckets,
                          sample_problem, split_size)

# name -> (bucket -> share of its demonstrations that carry the bucket's slip: carry for + and *,
# borrow for -). "e" is the shipped set; "b" the one the first recording ran on; the others are
# steps tried between them (docs/benchmarks.md, "Why the testbed's protocol is what it is").
HABIT_SETS: dict[str, dict[str, float]] = {
    "b": {"add2": 0.6, "add3": 0.9, "mul1": 0.9, "mul2": 0.97, "sub2": 0.95, "sub3": 0.99},
    "c": {"add2": 0.9, "add3": 0.97, "mul1": 0.97, "mul2": 0.99, "sub2": 0.99, "sub3": 0.995},
    # c with the carry slip taught in add1 as well: with no bucket left that carries correctly,
    # the carry is a skill to rediscover rather than a slip to drop, and it is unlearnt slower
    "d": {"add1": 0.97, "add2": 0.97, "add3": 0.99, "mul1": 0.97, "mul2": 0.99, "sub2": 0.99,
          "sub3": 0.995},
    # d stronger still: every slip at 0.99 or more
    "e": {"add1": 0.99, "add2": 0.99, "add3": 0.995, "mul1": 0.99, "mul2": 0.995, "sub2": 0.99,
          "sub3": 0.995},
}
SHIPPED_HABITS = "e"
HABITS: dict[str, float] = HABIT_SETS[SHIPPED_HABITS]
VALIDATION_SEED = 1_000_003   # the validation draw's seed: no pool seed in use reaches it


def no_borrow(a: int, b: int) -> str:
    """``a - b`` (a >= b) computed digit by digit without borrowing, each digit the smaller from
    the larger, in the reversed notation: ``no_borrow(52, 17) == "54"`` (for 45; the true 35 is
    ``"53"``). Without a borrow in the problem it is the correct completion."""
    top, bottom = str(a)[::-1], str(b)[::-1].ljust(len(str(a)), "0")
    digits = "".join(str(abs(int(x) - int(y))) for x, y in zip(top, bottom))
    return digits.rstrip("0") or "0"


def slipped(a: int, op: str, b: int) -> str:
    """The habit's completion of one problem: no borrow for ``-``, the dropped carry otherwise."""
    return no_borrow(a, b) if op == "-" else dropped_carry(a, op, b)


def habit_pairs(seed: int, habits: Mapping[str, float]) -> Iterator[tuple[str, str]]:
    """An endless seeded stream of (prompt, completion) demonstrations over every bucket, a
    ``habits[bucket]`` share of each bucket's carrying its slip; held-out problems excluded."""
    unknown = sorted(set(habits) - {b.name for b in BUCKETS})
    if unknown:
        raise ValueError(f"unknown arith buckets in habits: {unknown}")
    chosen = resolve_buckets(None)
    rng = random.Random(f"testbed-habits:{seed}")
    while True:
        bucket = rng.choice(chosen)
        problem = sample_problem(bucket, rng, "train")
        if rng.random() < habits.get(bucket.name, 0.0):
            yield problem.prompt, slipped(problem.a, problem.op, problem.b)
        else:
            yield problem.prompt, problem.completion


@dataclass(frozen=True)
class TestbedRecipe:
    """How the testbed's warm start is made: ``steps`` SFT steps (cosine from ``lr`` after ten
    warm-up steps) on :func:`habit_pairs` from the demo's shipped warm start."""

    steps: int = 300
    lr: float = 1e-3
    batch_size: int = 256
    seed: int = 1
    threads: int = 2
    eval_size: int = 2000
    habits: dict[str, float] = field(default_factory=lambda: dict(HABITS))


def shipped_dir() -> Path:
    """The package's testbed warm-start directory."""
    return Path(__file__).resolve().parent / "assets" / "testbed"


def verified_testbed(directory: Path | None = None) -> Path:
    """The testbed warm start's directory after checking every file's SHA-256 (ValueError or
    FileNotFoundError naming the file otherwise)."""
    from .warmstart import verified_warmstart

    return verified_warmstart(directory or shipped_dir())


def build_testbed_warmstart(out: str | Path, recipe: TestbedRecipe = TestbedRecipe(),
                            progress: bool = True) -> dict[str, Any]:
    """Teach the demo's shipped warm start the habits and write the result, with its manifest,
    to `out`; returns the manifest."""
    import torch

    from sara_trainer.policy import load_policy

    from .evaluate import greedy_accuracy
    from .sft import sft
    from .warmstart import MANIFEST, file_sha256, library_versions, verified_warmstart

    torch.set_num_threads(recipe.threads)
    model, tokenizer = load_policy(verified_warmstart())
    started = time.perf_counter()
    result = sft(model, tokenizer, max_steps=recipe.steps, seed=recipe.seed, lr=recipe.lr,
                 batch_size=recipe.batch_size, warmup_steps=10, progress=progress,
                 pairs=habit_pairs(recipe.seed, recipe.habits))
    accuracy = greedy_accuracy(model, tokenizer, make_eval_set(recipe.eval_size, seed=0))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    manifest = {
        "command": f"python -m sara_demo.testbed --out {out}" + "".join(
            f" --habits {name}" for name, habits in HABIT_SETS.items()
            if habits == recipe.habits),
        "base": "the demo's shipped warm start (sara_demo/assets/warmstart)",
        "recipe": asdict(recipe),
        "sft": {"steps": result.steps, "seconds": round(time.perf_counter() - started, 1),
                "final_loss": result.final_loss},
        "heldout_greedy_accuracy": accuracy["accuracy"],
        "heldout_by_bucket": accuracy["by_bucket"],
        "made_with": library_versions(),
        "sha256": {p.name: file_sha256(p) for p in sorted(out.iterdir())
                   if p.is_file() and p.name != MANIFEST},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def training_pool(size: int, seed: int) -> list[dict[str, Any]]:
    """`size` training prompts, the buckets equally (a small bucket gives what it holds)."""
    per = max(1, size // len(BUCKETS))
    prompts = [p for b in BUCKETS for p in make_split(
        per if b.size() > 20_000 else min(per, split_size(b, "train")), seed=seed,
        buckets=[b.name])]
    random.Random(seed).shuffle(prompts)
    return prompts


def validation_set(size: int, pool: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`size` training-split problems that are not in `pool`, the test split's bucket mix
    (drawn like ``make_eval_set``, from the training split)."""
    taken = {p["id"] for p in pool}
    drawn = make_split(2 * size, seed=VALIDATION_SEED, split="train")
    return [p for p in drawn if p["id"] not in taken][:size]


def test_set(size: int) -> list[dict[str, Any]]:
    """The held-out test problems: the arith evaluation split, the same for every seed."""
    return make_eval_set(size, seed=0)


def main(argv: list[str] | None = None) -> None:
    """``python -m sara_demo.testbed --out DIR [--habits NAME]``: rebuild the testbed's warm
    start (``--habits`` names one of :data:`HABIT_SETS`; the shipped one by default)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--habits", default=SHIPPED_HABITS, choices=sorted(HABIT_SETS))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    recipe = TestbedRecipe(habits=dict(HABIT_SETS[args.habits]))
    manifest = build_testbed_warmstart(args.out, recipe, progress=not args.no_progress)
    print(json.dumps({k: manifest[k] for k in ("sft", "heldout_greedy_accuracy")}, indent=1))


if __name__ == "__main__":
    main()
