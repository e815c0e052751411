"""Chat prompts (a list of {role, content} messages) through the API: stored, served by
GET /prompts, leased, and delivered in batches as messages; strings keep working; bad message
lists are a 422 at the door."""

from __future__ import annotations

import hashlib
import json

import pytest

from sara_client.limits import MAX_CHAT_MESSAGES, MAX_PROMPT_CHARS
from sara_client.models import PromptIn

from .conftest import result_for

pytestmark = pytest.mark.anyio

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 * 7? Put the answer in \\boxed{}."}]


async def test_chat_prompt_round_trips_through_store_lease_and_batch(api):
    mixed = {"script": "mixed"}
    out = await api.add({"id": "c1", "prompt": CHAT, "answer": "42", "meta": mixed},
                        {"id": "t1", "prompt": "plain text", "answer": "1", "meta": mixed})
    assert out["created"] == 2
    assert (await api.prompt("c1"))["prompt"] == CHAT
    assert (await api.prompt("t1"))["prompt"] == "plain text"
    lease = await api.lease("w1", 64)
    by_prompt = {r["prompt_id"]: r["prompt"] for r in lease["rollouts"]}
    assert by_prompt == {"c1": CHAT, "t1": "plain text"}
    await api.report("w1", [result_for(r) for r in lease["rollouts"]])
    await api.work()
    r = await api.next_batch(size=2)
    assert r.status_code == 200, r.text
    groups = {g["prompt_id"]: g["prompt"] for g in r.json()["groups"]}
    assert groups == {"c1": CHAT, "t1": "plain text"}


async def test_derived_id_is_stable_for_chat_and_unchanged_for_text(api):
    first = await api.add({"prompt": CHAT, "answer": "42"})
    again = await api.add({"prompt": [dict(m) for m in CHAT], "answer": "42"})
    assert first["ids"] == again["ids"] and again["created"] == 0
    text = await api.add({"prompt": "2+2?", "answer": "4"})
    # the id a text prompt always had: chat support must not re-key existing pools
    digest = hashlib.sha256(json.dumps(["exact", "2+2?", "4"]).encode()).hexdigest()[:20]
    assert text["ids"] == ["p" + digest]


@pytest.mark.parametrize("prompt, words", [
    ([], "at least 1"),
    ([{"role": "user"}], "content"),
    ([{"role": "robot", "content": "hi"}], "role"),
    ([{"role": "user", "content": "hi", "extra": 1}], "extra"),
    ([{"role": "user", "content": ""}], "empty"),
    ([{"role": "user", "content": "x" * (MAX_PROMPT_CHARS // 2 + 1)}] * 2, "characters"),
    ([{"role": "user", "content": "x"}] * (MAX_CHAT_MESSAGES + 1), "at most"),
    ("", "at least 1"),
    (7, "string"),
])
async def test_bad_chat_prompts_are_422(api, prompt, words):
    r = await api.post("/prompts", json={"prompts": [{"prompt": prompt}]})
    assert r.status_code == 422, r.text
    assert words in r.text


def test_prompt_in_accepts_chat_message_models_and_dicts():
    p = PromptIn.model_validate({"prompt": CHAT})
    assert p.model_dump()["prompt"] == CHAT
    assert PromptIn(prompt="text").prompt == "text"
