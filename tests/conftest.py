"""Shared fixtures.

- `redis_server` (session): one real redis-server (EmbeddedRedis, AOF on) in a temporary dir on
  a free loopback port, for the whole test session; `.url`, `.port`, `.data_dir`.
- `redis_url` (function): the URL of that server after FLUSHALL, so every test starts empty.
  Tests that use it must not run in parallel against the same server. (`single_redis_url` is
  the same; tests/store and tests/api override `redis_url` with `redis_url_each`.)
- `redis_cluster` (session): a real three-master Redis Cluster (tests/cluster/_local.py),
  formed on first use; `.url` (`redis+cluster://...`), `.clients`, `.owner_of(key)`.
- `redis_cluster_url` (function): its URL after FLUSHALL on every master.
- `redis_url_each` (function, parametrized "single" / "cluster"): `single_redis_url`, then
  `redis_cluster_url`: a test that takes it runs once on each.
- `fake_clock` (function): a `FakeClock`, `clock()` -> seconds, `clock.advance(s)`, for injecting
  as the service's clock.
- `anyio_backend`: "asyncio" for `@pytest.mark.anyio` tests.

Tiers: `python -m pytest -m "not slow"` is the fast tier to run while developing (single Redis,
no optional package needed); `.ci/run` runs everything. `slow` is set here on what starts real
processes (`e2e`), on the cluster runs of `redis_url_each`, on the folders of SLOW_FOLDERS, and
by hand on single tests measured to take seconds (`--durations`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# folders whose every test is slow, and why
SLOW_FOLDERS = {
    "integrations": "verl, OpenRLHF and TRL classes, and Ray, in-process",
    "faults": "kills and restarts real processes",
    "e2e": "the CLI and the demo as real processes",
    "cluster": "a three-master Redis Cluster, failover included",
}


def pytest_collection_modifyitems(config, items) -> None:
    """Mark as slow what the fast tier leaves out (see the module docstring)."""
    for item in items:
        try:
            folder = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        except ValueError:   # a test outside tests/ (none today)
            continue
        if folder in SLOW_FOLDERS or item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.slow)


class FakeClock:
    """A hand-driven clock: `clock()` is the current time, `advance(s)` moves it forward."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.now += seconds
        return self.now

    def set(self, now: float) -> None:
        self.now = float(now)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    from sara_service.embedded import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


def emptied(server) -> str:
    """The URL of a real redis-server, after deleting everything in it."""
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return server.url


@pytest.fixture
def single_redis_url(redis_server) -> str:
    return emptied(redis_server)


@pytest.fixture
def redis_url(single_redis_url) -> str:
    return single_redis_url


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    from tests.cluster._local import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster) -> str:
    redis_cluster.flush()
    return redis_cluster.url


# the cluster case belongs to the full suite (.ci/run), not to the fast tier (-m "not slow")
@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.slow)])
def redis_url_each(request) -> str:
    return request.getfixturevalue(
        "single_redis_url" if request.param == "single" else "redis_cluster_url")


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
