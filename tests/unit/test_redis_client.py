"""redis_client: the single-server client packs commands with hiredis, byte for byte as redis-py's
own Python packer would."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection, UnixDomainSocketConnection

from sara_service.store import redis_client
from sara_service.store.redis_client import HiredisPacking, connect

pytestmark = pytest.mark.skipif(redis_client.hiredis is None, reason="hiredis not installed")

COMMANDS = [
    ("GET", "k"),
    ("CONFIG GET", "appendonly"),  # a two-word command name goes as two arguments
    (b"CLIENT SETNAME", b"n"),
    ("EVALSHA", "a" * 40, 2, "sara:{r}:slots", "sara:{r}:group:g1", 1733.25, -3, 0.1, 1e-300,
     "héllo wörld", b"\x00\xff raw", memoryview(b"view"), "x" * 10_000, ""),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0]))
def test_hiredis_packing_sends_the_same_bytes_as_redis_py(command):
    python, fast = Connection(), connect("redis://localhost:1").connection_pool.connection_class()
    assert isinstance(fast, HiredisPacking)
    assert b"".join(fast.pack_command(*command)) == b"".join(python.pack_command(*command))


def test_every_single_server_scheme_keeps_its_connection_class():
    unix = connect("unix:///tmp/redis.sock").connection_pool.connection_class
    assert issubclass(unix, HiredisPacking) and issubclass(unix, UnixDomainSocketConnection)
    assert connect("redis://localhost:1").connection_pool.connection_class is connect(
        "redis://localhost:2").connection_pool.connection_class  # one class per base
