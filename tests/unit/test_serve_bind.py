"""`sara serve` refuses an open API on an address other machines can reach (Redis's protected
mode): a loopback address, a role token or `insecure` lets it start. The refusal through a real
process is in tests/e2e/test_first_hour.py."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from sara_service.process import UnsafeBind, check_bind, is_loopback
from sara_service.settings import Settings


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("sara.example.org", False)])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_an_open_api_off_loopback_is_refused_unless_tokens_or_insecure():
    open_api = Settings.model_construct()
    with pytest.raises(UnsafeBind, match="refusing to listen on 0.0.0.0 with no token set"):
        check_bind(open_api, "0.0.0.0")
    check_bind(open_api, "127.0.0.1")
    check_bind(open_api.model_copy(update={"insecure": True}), "0.0.0.0")
    check_bind(open_api.model_copy(update={"admin_token": SecretStr("t")}), "0.0.0.0")
    check_bind(open_api.model_copy(update={"worker_secret": SecretStr("s")}), "10.0.0.1")
