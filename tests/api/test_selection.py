"""Prompt selection through the service: predictors steer groups toward prompts that mix."""

from __future__ import annotations

import pytest

from tests.api.conftest import prompt_spec

pytestmark = pytest.mark.anyio


async def _train_rounds(api, rounds: int) -> None:
    """Each round: generate until idle, hand every ready batch to the 'trainer', bump the policy."""
    for version in range(1, rounds + 1):
        await api.work("w", n=16, rounds=40, policy_version=version - 1)
        while (r := await api.next_batch(wait_s=0)).status_code == 200:
            await api.post(f"/batches/{r.json()['batch_id']}/ack")
        await api.publish(version)


async def _groups_by_script(api, names: dict[str, str]) -> dict[str, int]:
    totals = {"fail": 0, "success": 0, "mixed": 0}
    for name, script in names.items():
        totals[script] += (await api.prompt(name))["history"]["groups"]
    return totals


POOL = {**{f"f{i}": "fail" for i in range(8)}, **{f"s{i}": "success" for i in range(8)},
        **{f"m{i}": "mixed" for i in range(4)}}


async def _wasted_groups(make_api, **settings) -> tuple[int, int]:
    """(saturated groups opened, mixed groups opened) over 12 training rounds on POOL."""
    api = await make_api(batch_size=2, prefetch_batches=1, max_staleness=100, namespace=
                         settings.get("selection", "x"), **settings)
    await api.add(*(prompt_spec(n, s) for n, s in POOL.items()))
    await _train_rounds(api, 12)
    totals = await _groups_by_script(api, POOL)
    return totals["fail"] + totals["success"], totals["mixed"]


@pytest.mark.parametrize("selection, decay", [("dps", 0.5), ("mopps", 0.8)])
async def test_predictive_selection_wastes_fewer_groups_than_epoch_order(make_api, selection,
                                                                         decay):
    # The trainer takes the same 24 mixed groups either way; the predictor's win is in how many
    # saturated groups it opens to find them (epoch order: about 4 per mixed group here).
    epoch_waste, epoch_mixed = await _wasted_groups(make_api, selection="epoch")
    waste, mixed = await _wasted_groups(make_api, selection=selection, selection_lambda=4,
                                        posterior_decay=decay, dps_decay=decay)
    assert mixed >= 24 and epoch_mixed >= 24
    assert waste < 0.75 * epoch_waste, (waste, epoch_waste)


async def test_history_selection_skips_prompts_known_to_saturate(make_api):
    api = await make_api(selection="history", prior="uniform", tau_skip=0.5,
                         posterior_decay=1.0, batch_size=2, prefetch_batches=1)
    # batches of two distinct prompts: two mixed ones can fill one while the failing one waits
    await api.add(prompt_spec("f", "fail"), prompt_spec("m0", "mixed"), prompt_spec("m1", "mixed"))
    await _train_rounds(api, 6)
    before = (await api.counters()).get("groups_skipped", 0)
    assert before > 0
    fail = (await api.prompt("f"))["history"]["groups"]
    mixed = [(await api.prompt(m))["history"]["groups"] for m in ("m0", "m1")]
    assert min(mixed) > fail


async def test_an_infinite_half_life_is_served_and_shown(make_api):
    # JSON has no infinity: /stats shows the string, and the posterior still learns
    api = await make_api(posterior_half_life=float("inf"), batch_size=2, prefetch_batches=1)
    await api.add(prompt_spec("m", "mixed"))
    await _train_rounds(api, 2)
    assert (await api.stats())["config"]["posterior_half_life"] == "inf"
    posterior = (await api.prompt("m"))["posterior"]
    assert posterior["alpha"] > 1 and posterior["beta"] > 1 and posterior["epoch"] > 0


async def test_greso_skips_prompts_whose_groups_keep_saturating(make_api):
    # GRESO keeps a prompt after c zero-variance groups in a row with chance max(p^c, 0.01):
    # the saturated prompts of POOL fall out of the epochs, the mixed ones never do.
    epoch_waste, _ = await _wasted_groups(make_api, selection="epoch")
    waste, mixed = await _wasted_groups(make_api, selection="greso")
    assert mixed >= 24
    assert waste < 0.75 * epoch_waste, (waste, epoch_waste)


async def test_group_ends_are_counted_by_outcome(make_api):
    api = await make_api(batch_size=2, prefetch_batches=1)
    await api.add(prompt_spec("f", "fail"), prompt_spec("s", "success"),
                  prompt_spec("m", "mixed"))
    await _train_rounds(api, 3)
    counters = await api.counters()
    groups = {name: (await api.prompt(name))["history"]["groups"] for name in "fsm"}
    assert counters["groups_ended_all_fail"] == groups["f"] > 0
    assert counters["groups_ended_all_success"] == groups["s"] > 0
    assert counters["groups_ended_mixed"] == groups["m"] > 0


async def test_stats_show_each_strategy_and_what_it_adds(make_api):
    """/stats' `strategy`: the names in force, GRESO's rates (stepped by the run, read from
    Redis), a ranked selection's round on this replica; nothing more under epoch order."""
    plain = await make_api(batch_size=2, prefetch_batches=1)
    await plain.add(*(prompt_spec(f"e{i}", "mixed") for i in range(4)))
    await _train_rounds(plain, 1)
    assert (await plain.stats())["strategy"] == {"policy": "sara", "selection": "epoch",
                                                  "group_sizing": "fixed"}
    greso = await make_api(batch_size=2, prefetch_batches=1, selection="greso")
    await greso.add(*(prompt_spec(f"g{i}", "fail") for i in range(4)))
    await _train_rounds(greso, 2)
    shown = (await greso.stats())["strategy"]
    assert shown["selection"] == "greso" and 0.0 < shown["p_easy"] <= 1.0
    assert 0.0 < shown["p_hard"] <= 1.0 and shown["stepped_at_version"] >= 0
    dps = await make_api(batch_size=2, prefetch_batches=1, selection="dps")
    await dps.add(*(prompt_spec(f"d{i}", "mixed") for i in range(8)))
    await _train_rounds(dps, 2)
    shown = (await dps.stats())["strategy"]
    assert shown["ranked_at_version"] >= 0 and shown["ranked_left"] >= 0
