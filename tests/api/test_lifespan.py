"""The app's lifespan always ends: stopping the upkeep loop may not depend on one cancel."""

from __future__ import annotations

import asyncio
import signal

import pytest

import sara_service.http.app as app_module
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


def test_sigterm_still_ends_a_process_that_runs_the_app_without_uvicorn(redis_url):
    # the lifespan chains SIGTERM to answer long polls; where nothing else handles SIGTERM (an
    # in-process app, as local() runs it) the default action must still end the process
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import asyncio, os, signal
        from sara_service.http.app import create_app
        from sara_service.settings import Settings

        async def main():
            app = create_app(Settings(redis_url={redis_url!r}, namespace="sigterm"))
            async with app.router.lifespan_context(app):
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(30)
            print("lifespan ended without dying")

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGTERM, (out.returncode, out.stdout, out.stderr)
