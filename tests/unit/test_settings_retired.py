"""A setting taken off the user surface: ignored, said once, and the process that started Redis
still says so in /stats' config."""

from __future__ import annotations

import logging

from sara_service import retired_settings
from sara_service.retired_settings import RETIRED_SETTINGS, retired_settings_in
from sara_service.settings import Settings


def test_redis_embedded_is_not_settable_from_outside(monkeypatch):
    monkeypatch.setenv("SARA_REDIS_EMBEDDED", "true")
    s = Settings(redis_url="redis://127.0.0.1:6379/0")
    assert s.redis_embedded is False
    assert s.public_config()["redis"] == "external"
    assert "redis_embedded" not in Settings.model_fields


def test_the_process_that_started_redis_says_so():
    s = Settings().on_embedded_redis("redis://127.0.0.1:7000/0")
    assert s.redis_embedded and s.redis_url == "redis://127.0.0.1:7000/0"
    assert s.public_config()["redis"] == "embedded"
    assert Settings(redis_url="redis://127.0.0.1:7000/0").redis_embedded is False


def test_a_retired_setting_is_named_once_a_process(monkeypatch, caplog):
    monkeypatch.setenv("SARA_REDIS_EMBEDDED", "false")
    monkeypatch.setattr(retired_settings, "_said", set())
    with caplog.at_level(logging.WARNING, logger="sara.service"):
        Settings()
        Settings()
    said = [r.getMessage() for r in caplog.records if "no longer a setting" in r.getMessage()]
    assert said == [f"SARA_REDIS_EMBEDDED is no longer a setting and is ignored: "
                    f"{RETIRED_SETTINGS['SARA_REDIS_EMBEDDED']}"]


def test_nothing_is_said_without_a_retired_setting():
    assert retired_settings_in({"SARA_GROUP_SIZE": "8"}) == []
