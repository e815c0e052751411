"""The app's lifespan always ends: stopping the upkeep loop may not depend on one cancel."""

from __future__ import annotations

import asyncio

import pytest

import sara_service.app as app_module
from sara_service.settings import Settings

pytestmark = pytest.mark.anyio


async def test_shutdown_completes_even_when_upkeep_runs_back_to_back(redis_url, monkeypatch):
    # redis-py can swallow a cancel that lands mid-command; with no pause between upkeep rounds
    # a single task.cancel() left about one shutdown in five hanging
    monkeypatch.setattr(app_module, "MAINTENANCE_INTERVAL_S", 0.0)
    for i in range(20):
        app = app_module.create_app(Settings(redis_url=redis_url, namespace=f"life{i}"))
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        await asyncio.sleep(0.002 * (i % 5))
        await asyncio.wait_for(lifespan.__aexit__(None, None, None), timeout=10)
