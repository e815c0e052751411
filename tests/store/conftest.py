"""Fixtures for store tests: a Store on a real, freshly flushed redis-server."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from sara_client.models import PromptIn
from sara_service.store import Store


@pytest.fixture
async def store(redis_url):
    """A Store with one registered prompt, "p", that store tests open their groups for."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        s = Store(client, "test")
        await s.add_prompts([("p", PromptIn(prompt="q"))], 1.0, 1.0, 0)
        yield s
    finally:
        await client.aclose()
