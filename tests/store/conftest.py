"""Fixtures for store tests: a Store on a real, freshly flushed redis-server, then on a real
three-master Redis Cluster."""

from __future__ import annotations

import pytest

from sara_client.models import PromptIn
from sara_service.store.redis_client import connect
from sara_service.store.store import Store


@pytest.fixture
def redis_url(redis_url_each) -> str:
    """Every test here runs on one Redis server and again on a three-master Redis Cluster."""
    return redis_url_each


@pytest.fixture
async def store(redis_url):
    """A Store with one registered prompt, "p", that store tests open their groups for."""
    client = connect(redis_url)
    try:
        s = Store(client, "test")
        await s.prompts.add_prompts([("p", PromptIn(prompt="q"))], 1.0, 1.0, 0)
        yield s
    finally:
        await client.aclose()
