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
import functools
import random
import time

from sara_service.math.selection import MAX_STEPS_FORWARD, STATES, DpsParams, dps_mixed_probability


def walk_from_scratch(observations: list, version: int, params: DpsParams) -> float:
    """P(mixed) as DPS defines it (``sara_service.math.selection``'s docstring), cached as the
    scheduler's scoring was before the walks were kept: the filtered chain by history, the
    score by (history, version), and the walk from the last observation redone at every new
    version."""
    last_at = {int(o[0]): str(o[1]) for o in sorted(observations, key=lambda o: o[0])}
    return _scored(tuple(last_at.items()), version, params)


def _walk(belief: list[float], counts: list[list[float]], steps: int, params: DpsParams):
    """`steps` versions on: push the belief through the normalised rows, then decay."""
    for _ in range(min(steps, MAX_STEPS_FORWARD)):
        rows = [[c / sum(row) for c in row] for row in counts]
        belief = [sum(belief[i] * rows[i][j] for i in range(3)) for j in range(3)]
        counts = [[params.prior + params.decay * (c - params.prior) for c in row]
                  for row in counts]
    return belief, counts


@functools.lru_cache(maxsize=1 << 14)
def _filtered(history: tuple, params: DpsParams):
    belief, counts = [1 / 3] * 3, [[params.prior] * 3 for _ in range(3)]
    at = None
    for seen_at, outcome in history:
        if at is not None:
            belief, counts = _walk(belief, counts, seen_at - 1 - at, params)
        state = STATES.index(outcome)
        rows = [[c / sum(row) for c in row] for row in counts]
        joint = [belief[i] * rows[i][state] for i in range(3)]
        counts = [[params.prior + params.decay * (c - params.prior) for c in row]
                  for row in counts]
        for i in range(3):
            counts[i][state] += joint[i] / sum(joint)
        belief, at = [float(i == state) for i in range(3)], seen_at
    return belief, counts, at


@functools.lru_cache(maxsize=1 << 16)
def _scored(history: tuple, version: int, params: DpsParams) -> float:
    belief, counts, at = _filtered(history, params)
    belief, _ = _walk(belief, counts, 1 if at is None else max(1, version - at), params)
    return belief[STATES.index("M")]


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
    before, expected = simulate(walk_from_scratch, args)
    after, got = simulate(dps_mixed_probability, args)   # its caches start empty here
    same = all(abs(a - b) <= 1e-12 for a, b in zip(expected, got))
    print(f"{len(got):,} scores over {args.versions} versions, {args.pool:,} prompts: "
          f"walk at every version {before:.2f} s, kept walks {after:.2f} s "
          f"({before / after:.2f}x); the same figures: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
