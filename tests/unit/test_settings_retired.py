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


def test_internal_settings_come_only_from_a_benchmarks_own_process(monkeypatch, tmp_path):
    from sara_service.settings import INTERNAL_SETTINGS

    assert INTERNAL_SETTINGS == {"posterior_decay", "dps_censored", "work_floor"}
    monkeypatch.setenv("SARA_POSTERIOR_DECAY", "0.5")
    monkeypatch.setenv("SARA_DPS_CENSORED", "false")
    monkeypatch.setenv("SARA_WORK_FLOOR", "2")
    monkeypatch.setenv("SARA_GROUP_SIZE", "16")   # the environment still sets the others
    env_file = tmp_path / ".env"
    env_file.write_text("SARA_WORK_FLOOR=3\n")
    s = Settings(_env_file=env_file)
    assert (s.posterior_decay, s.dps_censored, s.work_floor, s.group_size) == (1.0, True, 1.0, 16)
    inside = Settings(posterior_decay=0.5, dps_censored=False, work_floor=2.0)
    assert (inside.posterior_decay, inside.dps_censored, inside.work_floor) == (0.5, False, 2.0)
    # each is named as retired to a run that sets it
    said = retired_settings_in({"SARA_POSTERIOR_DECAY": "0.5", "SARA_WORK_FLOOR": "2"})
    assert [m.split(" ")[0] for m in said] == ["SARA_POSTERIOR_DECAY", "SARA_WORK_FLOOR"]
    assert {f"SARA_{n.upper()}" for n in INTERNAL_SETTINGS} <= set(RETIRED_SETTINGS)


def test_sara_serve_offers_no_flag_for_an_internal_setting():
    from typer.testing import CliRunner

    from sara_cli.main import app

    text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "--prefetch-batches" in text
    for flag in ("--work-floor", "--posterior-decay", "--dps-censored"):
        assert flag not in text
