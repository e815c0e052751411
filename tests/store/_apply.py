"""The store tests' way to apply results: the arguments they were written in, as a typed Report."""

from __future__ import annotations

import math
from typing import Any

from sara_service.store.results import AppliedResults, Learning, Report


async def apply_results(store: Any, now: float, worker_id: str, results: list, successes: list,
                        decay: float, alpha0: float, beta0: float, retention_s: float,
                        half_life: float = math.inf, **options: Any) -> AppliedResults:
    """`store.results.apply` with a Report of these fields (`options`: report_id, holder_only,
    levels, levels_in_use, report_ttl_s)."""
    learning = Learning(alpha0, beta0, decay, half_life)
    return await store.results.apply(now, Report(worker_id, results, successes, learning,
                                                 retention_s, **options))
