"""POST /prompts and GET /prompts/{id}: ids, idempotence, posterior and history."""

from __future__ import annotations

import pytest

from sara_client import NotFoundError

from .conftest import prompt_spec, sdk_for

pytestmark = pytest.mark.anyio


async def test_add_returns_ids_in_order_and_created_count(api):
    out = await api.add(prompt_spec("p1", "mixed"), prompt_spec("p2", "fail"),
                        prompt_spec("p3", "success"))
    assert out == {"ids": ["p1", "p2", "p3"], "created": 3, "content_differs": []}


async def test_readding_an_id_is_a_noop_and_keeps_the_first_content(api):
    await api.add(prompt_spec("p1", "mixed"))
    again = await api.add({"id": "p1", "prompt": "different text", "answer": "7"})
    assert again == {"ids": ["p1"], "created": 0, "content_differs": ["p1"]}
    got = await api.prompt("p1")
    assert got["prompt"] == "question p1" and got["answer"] == "42"

    mixed = await api.add(prompt_spec("p1", "mixed"), prompt_spec("p4", "fail"))
    assert mixed == {"ids": ["p1", "p4"], "created": 1, "content_differs": []}


async def test_same_id_twice_in_one_call_is_created_once(api):
    out = await api.add(prompt_spec("dup", "fail"), prompt_spec("dup", "fail"))
    assert out == {"ids": ["dup", "dup"], "created": 1, "content_differs": []}


async def test_id_is_derived_from_content_when_absent(api):
    first = await api.add({"prompt": "2+2?", "answer": "4"})
    second = await api.add({"prompt": "2+2?", "answer": "4"})
    assert first["created"] == 1 and second["created"] == 0
    assert first["ids"] == second["ids"]
    (pid,) = first["ids"]
    assert (await api.prompt(pid))["prompt"] == "2+2?"

    other_answer = await api.add({"prompt": "2+2?", "answer": "5"})
    other_task = await api.add({"prompt": "2+2?", "answer": "4", "task": "math"})
    other_text = await api.add({"prompt": "2+3?", "answer": "4"})
    ids = {pid, *other_answer["ids"], *other_task["ids"], *other_text["ids"]}
    assert len(ids) == 4
    assert other_answer["created"] == other_task["created"] == other_text["created"] == 1


async def test_missing_answer_and_literal_none_answer_get_distinct_ids(api):
    without = await api.add({"prompt": "name a null value"})
    literal = await api.add({"prompt": "name a null value", "answer": "None"})
    assert without["ids"] != literal["ids"]
    assert literal["created"] == 1


async def test_get_prompt_shows_content_prior_posterior_and_empty_history(api):
    await api.add(prompt_spec("p1", "mixed", task="math"))
    got = await api.prompt("p1")
    assert got == {
        "id": "p1", "prompt": "question p1", "answer": "42", "task": "math",
        "meta": {"script": "mixed"},
        "posterior": {"alpha": 1.0, "beta": 1.0, "version": 0, "epoch": None},
        "history": {"groups": 0, "committed": 0, "abandoned": 0, "rollouts": 0,
                    "successes": 0, "last_group_id": None},
    }


async def test_initial_posterior_is_the_configured_prior_at_the_current_version(make_api):
    api = await make_api(prior_alpha=2.0, prior_beta=3.0)
    assert (await api.publish(3)).status_code == 200
    await api.add(prompt_spec("p1", "fail"))
    assert (await api.prompt("p1"))["posterior"] == {"alpha": 2.0, "beta": 3.0, "version": 3,
                                                     "epoch": None}


async def test_defaults_for_optional_fields(api):
    (pid,) = (await api.add({"prompt": "bare"}))["ids"]
    got = await api.prompt(pid)
    assert got["answer"] is None and got["task"] == "exact" and got["meta"] == {}


async def test_unknown_prompt_is_a_404_envelope(api):
    r = await api.get("/prompts/nope")
    assert r.status_code == 404
    body = r.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == "unknown_prompt"
    assert "nope" in body["error"]["message"]


@pytest.mark.parametrize("prompts, field", [
    ([], "body.prompts"),
    ([{"id": "has space", "prompt": "x"}], "body.prompts.0.id"),
    ([{"prompt": ""}], "body.prompts.0.prompt"),
    ([{"prompt": "x", "task": "bad task!"}], "body.prompts.0.task"),
    ([{"prompt": "x", "colour": "red"}], "body.prompts.0.colour"),
])
async def test_invalid_prompts_are_422_naming_the_field(api, prompts, field):
    r = await api.post("/prompts", {"prompts": prompts})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_request"
    assert err["message"].startswith(field), err["message"]
    assert (await api.counters())["groups_opened"] == 0


async def test_sdk_round_trip(api):
    async with sdk_for(api.app) as sara:
        added = await sara.add_prompts([prompt_spec("p1", "mixed"), {"prompt": "free"}])
        assert added.created == 2 and added.ids[0] == "p1"
        got = await sara.get_prompt("p1")
        assert got.posterior.alpha == 1.0 and got.meta == {"script": "mixed"}
        with pytest.raises(NotFoundError) as info:
            await sara.get_prompt("missing")
        assert info.value.code == "unknown_prompt"
