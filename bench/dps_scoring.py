#!/usr/bin/env python
"""DPS's scoring cost on a testbed-like pattern: a pool of prompts, at every policy version some
picks of a few random candidates each (every candidate scored) and some groups ending (a new
observation for their prompts). Scores with the kept forward walks (``dps_mixed_probability``)
against a walk from each history's last observation at every version (what it did before), and
checks that the two give the same figures.

Usage:
    python bench/dps_scoring.py                  # 1,000 prompts, 94 picks of 8, 100 versions
    python bench/dps_scoring.py --versions 200 --pool 17000
"""

from __future__ import annotations

import argparse
import random
import time

from sara_service.math import selection
from sara_service.math.selection import DpsParams, dps_mixed_probability


def walk_from_scratch(observations: list, version: int, params: DpsParams) -> float:
    """P(mixed) walked from the last observation at this version, nothing kept between calls."""
    key = tuple((int(o[0]), str(o[1]), 0.0) for o in sorted(observations, key=lambda o: o[0]))
    belief, counts, at = selection._filtered(key, params)
    steps = 1 if at is None else max(1, version - at)
    rows = [list(row) for row in counts]
    if at is None:
        return selection._step(list(belief), rows)[1]
    advanced, _ = selection._advance(list(belief), rows, steps, params)
    return advanced[1]


def simulate(score, args: argparse.Namespace) -> tuple[float, list[float]]:
    """(seconds spent scoring, every score) over the simulated versions."""
    rng, params = random.Random(args.seed), DpsParams()
    history: dict[int, list] = {p: [] for p in range(args.pool)}
    spent, scores = 0.0, []
    for version in range(args.versions):
        for _ in range(args.picks):
            candidates = rng.sample(range(args.pool), args.candidates)
            started = time.perf_counter()
            scores += [score(history[p], version, params) for p in candidates]
            spent += time.perf_counter() - started
        for p in rng.sample(range(args.pool), args.picks):
            history[p] = (history[p] + [[version, rng.choice("FMS")]])[-16:]
    return spent, scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool", type=int, default=1000)
    p.add_argument("--picks", type=int, default=94, help="picks (and ended groups) a version")
    p.add_argument("--candidates", type=int, default=8, help="candidates scored a pick")
    p.add_argument("--versions", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if min(args.pool, args.picks, args.candidates, args.versions) < 1 or \
            max(args.picks, args.candidates) > args.pool:
        p.error("every size must be >= 1, and picks and candidates at most the pool")
    selection._filtered.cache_clear()   # each side fills the filtered-history cache itself
    before, expected = simulate(walk_from_scratch, args)
    selection._filtered.cache_clear()
    selection._forward.cache_clear()
    after, got = simulate(dps_mixed_probability, args)
    same = all(abs(a - b) <= 1e-12 for a, b in zip(expected, got))
    print(f"{len(got):,} scores over {args.versions} versions, {args.pool:,} prompts: "
          f"walk at every version {before:.2f} s, kept walks {after:.2f} s "
          f"({before / after:.2f}x); the same figures: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
