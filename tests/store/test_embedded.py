"""EmbeddedRedis runs a real redis-server with AOF persistence."""

from __future__ import annotations

import pytest
import redis

from sara_service import embedded
from sara_service.embedded import EmbeddedRedis, find_redis_server
from tests.cluster._local import sync_client


def _aof_files(data_dir):
    # Redis 6 writes appendonly.aof; Redis 7 an appendonlydir/ of parts.
    return [p for p in data_dir.rglob("appendonly*") if p.is_file()]


def test_starts_real_server_with_aof(tmp_path):
    with EmbeddedRedis(tmp_path / "data") as server:
        assert server.running and server.port > 0
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        assert client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        info = client.info("persistence")
        assert info["aof_enabled"] == 1
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        assert client.config_get("save")["save"] == ""
        assert client.config_get("dir")["dir"] == str((tmp_path / "data").resolve())
        client.close()
        files = _aof_files(tmp_path / "data")
        assert files, list((tmp_path / "data").iterdir())
        assert any(b"greeting" in f.read_bytes() for f in files)


def test_stop_ends_process_and_is_idempotent(tmp_path):
    server = EmbeddedRedis(tmp_path).start()
    proc = server.process
    server.stop()
    assert proc.poll() is not None
    assert not server.running
    server.stop()  # second stop: no error


def test_data_survives_restart_from_same_dir(tmp_path):
    with EmbeddedRedis(tmp_path) as first:
        client = redis.Redis.from_url(first.url)
        client.hset("h", mapping={"a": "1", "b": "2"})
        client.rpush("l", "x", "y")
        client.close()
    with EmbeddedRedis(tmp_path) as second:
        client = redis.Redis.from_url(second.url)
        assert client.hgetall("h") == {b"a": b"1", b"b": b"2"}
        assert client.lrange("l", 0, -1) == [b"x", b"y"]
        client.close()


def test_two_servers_get_distinct_ports(tmp_path):
    with EmbeddedRedis(tmp_path / "a") as a, EmbeddedRedis(tmp_path / "b") as b:
        assert a.port != b.port


def test_taken_fixed_port_is_a_clear_error(tmp_path):
    with EmbeddedRedis(tmp_path / "a") as a:
        with pytest.raises(RuntimeError, match="did not start"):
            EmbeddedRedis(tmp_path / "b", port=a.port, startup_timeout_s=5).start()


def test_find_redis_server_runs():
    exe = find_redis_server()
    assert embedded._runs(exe)


def test_find_redis_server_says_how_to_get_one(monkeypatch):
    monkeypatch.delenv("SARA_REDIS_SERVER", raising=False)
    monkeypatch.setattr(embedded.shutil, "which", lambda name: None)
    monkeypatch.setattr(embedded.sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="no redis-server found"):
        find_redis_server()


def test_sara_redis_server_env_wins(monkeypatch, tmp_path):
    exe = find_redis_server()
    monkeypatch.setenv("SARA_REDIS_SERVER", exe)
    monkeypatch.setattr(embedded.shutil, "which", lambda name: "/nonexistent/redis-server")
    assert find_redis_server() == exe
    monkeypatch.setenv("SARA_REDIS_SERVER", str(tmp_path / "missing"))  # broken: falls through
    assert find_redis_server() != str(tmp_path / "missing")


def test_redis_url_fixture_gives_a_clean_database(redis_url):
    client = sync_client(redis_url)
    assert client.dbsize() == 0
    client.set("left-behind", "1")  # the next test using redis_url must not see it
    client.close()


def test_redis_url_fixture_flushes_between_tests(redis_url):
    client = sync_client(redis_url)
    assert client.get("left-behind") is None
    client.close()


def test_fake_clock(fake_clock):
    t0 = fake_clock()
    assert fake_clock.advance(2.5) == t0 + 2.5
    assert fake_clock() == t0 + 2.5
    with pytest.raises(ValueError):
        fake_clock.advance(-1)


def _poll(predicate, deadline_s: float, what: str):
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)  # polling a condition with a deadline
    raise AssertionError(f"timed out waiting for {what}")


def test_supervised_server_killed_is_restarted_on_its_port_with_its_data(tmp_path):
    server = EmbeddedRedis(tmp_path / "data").start().supervise(retry_s=0.01)
    try:
        client = redis.Redis.from_url(server.url)
        client.set("kept", "yes")
        client.close()
        first = server.process.pid
        server.process.kill()
        _poll(lambda: server.restarts == 1 and server.running, 30, "the restart")
        assert server.process.pid != first
        client = redis.Redis.from_url(server.url)
        assert client.get("kept") == b"yes"
        client.close()
    finally:
        server.stop()
    assert not server.running and server.restarts == 1  # stop() is not a crash


def test_supervisor_says_when_it_cannot_restart_and_recovers(tmp_path):
    server = EmbeddedRedis(tmp_path / "data").start().supervise(retry_s=0.01, max_retry_s=0.05,
                                                                failures_before_giving_up=2)
    real = server.executable or find_redis_server()
    try:
        server.executable = "/bin/false"  # every start fails from now on
        server.process.kill()
        _poll(lambda: server.restart_failed, 30, "restart_failed")
        server.executable = real
        _poll(lambda: server.running and not server.restart_failed, 30, "recovery")
    finally:
        server.stop()
