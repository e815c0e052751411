"""bench/audit_coverage.py: the live DS estimate's 95% interval, through the real scheduler on
pools with known success rates, contains the exact DS figure in at least 18 of 20 seeded runs."""

from __future__ import annotations

import asyncio

import pytest

from .test_allocation_bench import _load

coverage = _load("bench_audit_coverage", "audit_coverage.py")


def test_exact_ds_figure_of_a_known_pool():
    # γ = 0.5 for every prompt: P(mixed) = 1 - 2 / 2^k
    assert coverage.exact_ds([0.5] * 10, 4) == pytest.approx(4 / (1 - 2 / 16))
    gammas = coverage.make_gammas(3000, 0)
    assert all(0 <= g <= 1 for g in gammas)
    assert 0.3 < sum(g < 0.12 for g in gammas) / 3000 < 0.45  # a third, and the Beta tail


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_interval_covers_what_ds_really_spends_in_18_of_20_seeded_runs():
    async def all_runs():
        return [await coverage.run_once(seed, 8, groups=1200, audit=0.15, prompts=600)
                for seed in range(20)]

    rows = asyncio.run(all_runs())
    summary = coverage.summarise(rows)
    print(coverage.format_rows(rows))
    print(f"covered {summary['covered']}/20; median relative width "
          f"{summary['median_relative_width']:.1%}, max {summary['max_relative_width']:.1%}")
    assert summary["covered"] >= 18
    # an interval that always covers because it is huge would pass the line above
    assert summary["max_relative_width"] < 0.35
    assert all(r["audited"] > 0 and r["point"] is not None for r in rows)
