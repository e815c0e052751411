"""The embedded redis-server SIGKILLed under `sara serve`: the scheduler
restarts it on the same port from the same data directory, says so in its log, and nothing that
was committed is lost; /healthz stays 200 through the short outage, /readyz reports it.

`sara serve` runs without SARA_REDIS_URL (it starts the embedded Redis itself, AOF on); the test
finds the server's pid with INFO, kills it, and polls (with a deadline) until the scheduler serves
again from a new redis-server process.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid

import httpx
import pytest
import redis

from tests.e2e._harness import load_synthetic

from ._support import serve_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
N_PROMPTS = 40


def _embedded_url(server, deadline_s: float = 30.0) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = re.search(r"embedded redis at (redis://\S+)", server.log_tail(20000))
        if found:
            return found.group(1)
        time.sleep(0.05)  # polling the log with a deadline
    raise AssertionError("no embedded redis line in the log")


def _redis_pid(url: str) -> int | None:
    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    try:
        return int(client.info("server")["process_id"])
    except redis.RedisError:
        return None
    finally:
        client.close()


def _poll(predicate, deadline_s: float, what: str):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling a condition with a deadline
    raise AssertionError(f"timed out waiting for {what}")


def test_a_killed_embedded_redis_is_restarted_and_loses_nothing(tmp_path):
    server = serve_process(tmp_path, "", f"embedded-{uuid.uuid4().hex[:8]}", "serve",
                           group_size=4, batch_size=4, seed=0)
    server.args = [a for a in server.args if a != ""]
    server.args.remove("--redis-url")
    server.args += ["--data-dir", str(tmp_path / "data")]
    server.start()
    try:
        url = _embedded_url(server)
        load_synthetic(server.url, N_PROMPTS, 0)
        lease = httpx.post(f"{server.url}/leases", json={"worker_id": "w1", "max_rollouts": 4})
        assert len(lease.json()["rollouts"]) == 4
        before = httpx.get(f"{server.url}/stats").json()["counters"]
        pid = _redis_pid(url)
        os.kill(pid, signal.SIGKILL)
        _poll(lambda: httpx.get(f"{server.url}/readyz").status_code == 503
              or _redis_pid(url) not in (None, pid), 10, "the outage to show or end")
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        new_pid = _poll(lambda: (p := _redis_pid(url)) not in (None, pid) and p, 30,
                        "a new redis-server")
        _poll(lambda: httpx.get(f"{server.url}/readyz").status_code == 200, 30, "readiness")
        after = httpx.get(f"{server.url}/stats").json()["counters"]
        assert new_pid != pid
        for name in ("prompts_registered", "groups_opened", "rollouts_issued", "leases_granted"):
            if name in before:
                assert after[name] == before[name], name
        log = server.log_tail(20000)
        assert re.search(r"embedded redis .*exited.*restart", log), log
        assert server.alive
    finally:
        code = server.stop()
        print(server.log_tail())
    assert code == 0
