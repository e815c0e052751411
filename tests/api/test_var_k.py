"""SARA_GROUP_SIZING=var_k through the HTTP API on a real Redis: a draw of SARA_VK_BATCH
prompts splits its budget of k per prompt by Knapsack RL's rule (math.knapsack). Unseen
prompts get k; then a solved prompt gets the minimum, a mixed one what its value asks, and a
hopeless one the surplus; the groups are delivered whole at their own sizes."""

from __future__ import annotations

import pytest

from .conftest import prompt_spec, slot_of, sync_round

pytestmark = pytest.mark.anyio

K, PROMPTS = 8, 8


def reward(rollout: dict) -> float:
    kind = rollout["prompt_id"][0]
    if kind == "m":
        return float(slot_of(rollout["rollout_id"]) % 2)   # p = 0.5
    return 1.0 if kind == "s" else 0.0                     # solved; hopeless


async def _two_epochs(make_api, policy: str):
    api = await make_api(policy=policy, group_size=K, group_sizing="var_k", vk_batch=PROMPTS,
                         batch_size=8, prefetch_batches=8)
    await api.add(*[prompt_spec(f"{kind}{i}", "fail")
                    for kind, n in (("m", 3), ("f", 3), ("s", 2)) for i in range(n)])
    delivered: list[dict] = []
    for _ in range(2):   # one draw of the whole pool per round: an epoch each
        assert await sync_round(api, reward, delivered, PROMPTS * K) > 0
    return api, delivered


async def test_a_draw_splits_its_budget_by_value(make_api):
    api, delivered = await _two_epochs(make_api, "dynamic_sampling")
    rollouts = {pid: (await api.prompt(pid))["history"]["rollouts"]
                for pid in ("m0", "m1", "m2", "f0", "f1", "f2", "s0", "s1")}
    # epoch 1: k each (nothing known); epoch 2 (budget 64): solved 2, mixed 2 + their need of
    # 3 (log 0.1 / log 0.5, truncated), the surplus 39 to the hopeless ones, 13 each over 2
    assert rollouts == {"m0": K + 5, "m1": K + 5, "m2": K + 5, "f0": K + 15, "f1": K + 15,
                        "f2": K + 15, "s0": K + 2, "s1": K + 2}
    assert sum(rollouts.values()) == 2 * PROMPTS * K
    sizes = sorted(len(g["rollouts"]) for g in delivered)
    assert sizes == [5, 5, 5, K, K, K]   # only the mixed prompts' groups, whole
    for group in delivered:
        assert sorted(slot_of(r["rollout_id"]) for r in group["rollouts"]) == list(
            range(len(group["rollouts"])))
    # /stats reads the groups of 5 in groups of k: 128 rollouts for 39 delivered, 3 of the 6
    # groups of 5, so 26.3 per group of k against 21.3 per group delivered
    derived = (await api.stats())["derived"]
    assert derived["rollouts_per_group_of_k"] == pytest.approx(128 * K / 39)
    assert derived["rollouts_per_effective_group"] == pytest.approx(128 / 6)
    # the saving against DS's figure (per group of k) counts the 6 committed groups as 39 / k
    c = (await api.stats())["counters"]
    assert c["groups_committed"] == 6
    ds_figure = derived["ds_rollouts_per_effective_group"]
    assert derived["net_rollouts_saved_vs_ds"] == pytest.approx(39 / K * ds_figure - 128)
    assert derived["net_saving_vs_ds"] == pytest.approx(1 - (128 * K / 39) / ds_figure)


async def test_under_sara_the_surplus_on_a_hopeless_prompt_is_abandoned(make_api):
    api, delivered = await _two_epochs(make_api, "sara")
    # SARA's mixed groups of the first draw are still filling when the second comes, and a
    # prompt has one group in flight at a time: the second draw splits 5 x k over the solved
    # (2 each) and the hopeless prompts (the surplus, 12 each)
    for pid in ("f0", "f1", "f2"):
        history = (await api.prompt(pid))["history"]
        group = await api.group(history["last_group_id"])
        assert group["k"] == 12 and history["rollouts"] < K + 12   # sized 12, stopped early
    assert all(g["prompt_id"][0] == "m" for g in delivered)


async def test_var_k_refuses_what_it_cannot_size(make_app):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="sizes them by its own rule"):
        make_app(policy="pilot_commit", group_size=32, group_sizing="var_k")
    with pytest.raises(ValidationError, match="must lie within SARA_VK_MIN"):
        make_app(group_size=8, group_sizing="var_k", vk_max=4)
    with pytest.raises(ValidationError, match="leave SARA_TAU_LOW fixed"):
        make_app(group_sizing="var_k", tau_low="auto")
