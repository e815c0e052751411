"""The demo's RL prompt pool: arith training prompts spread over the difficulty buckets."""

from __future__ import annotations

from .config import DemoConfig


def prompt_pool(model, tokenizer, cfg: DemoConfig, buckets: list[str] | None
                ) -> tuple[list[dict], dict[str, float]]:
    """The RL training prompts, spread over the buckets by how often a group of k samples comes
    out mixed on a small probe (a bucket-level predictor, measured on training problems; SARA still
    decides every group). A policy that has learnt only some buckets then spends its rollouts
    where groups can be effective, whatever SFT reached on this machine in its time budget.

    Returns (prompts, {bucket: weight}); weights are the mixed fraction plus ``bucket_floor``,
    or equal with ``pool="flat"`` (no probe: the allocator alone meets the saturated buckets).
    """
    import torch

    from .evaluate import group_outcomes
    from .tasks.arith import BUCKET_NAMES, make_split

    names = list(buckets or BUCKET_NAMES)
    if cfg.pool == "flat":
        return _pool(cfg, {b: 1.0 / len(names) for b in names})
    probe = [p for b in names
             for p in make_split(min(cfg.probe_per_bucket, _capacity(b)),
                                 seed=cfg.seed + 1, buckets=[b])]
    spread = group_outcomes(model, tokenizer, probe, k=cfg.group_size, temperature=1.0,
                            max_new_tokens=cfg.max_new_tokens,
                            generator=torch.Generator().manual_seed(cfg.seed))
    weights = {b: spread["by_bucket"].get(b, {}).get("mixed", 0.0) + cfg.bucket_floor
               for b in names}
    total = sum(weights.values())
    return _pool(cfg, {b: weights[b] / total for b in names})


def _pool(cfg: DemoConfig, shares: dict[str, float]) -> tuple[list[dict], dict[str, float]]:
    """``cfg.prompts`` training prompts split over the buckets by `shares`, shuffled."""
    import random

    from .tasks.arith import make_split

    prompts: list[dict] = []
    for b, share in shares.items():
        n = max(1, round(cfg.prompts * share))
        prompts.extend(make_split(min(n, _capacity(b)), seed=cfg.seed, buckets=[b]))
    random.Random(cfg.seed).shuffle(prompts)
    return prompts, shares


def _capacity(bucket: str) -> int:
    """Training problems a bucket holds (big buckets: more than any demo asks for)."""
    from .tasks.arith import get_bucket, split_size

    if get_bucket(bucket).size() > 20_000:
        return 1 << 30
    return split_size(bucket, "train")
