"""Structured logs: a record comes out as one JSON object carrying the run, worker and batch ids
from the process, a log_context block or the record's `extra`."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from sara_client.logs import JsonFormatter, configure_logging, log_context, resolve_format


def record(msg: str = "step %d", *args, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("sara.trainer", logging.INFO, __file__, 1, msg, args or (3,), None)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_a_record_is_one_json_object_with_the_id_fields():
    fmt = JsonFormatter({"run": "ns1", "worker_id": "w7", "unset": None})
    with log_context(batch_id="b42"):
        line = fmt.format(record(step=3, policy_version=2))
    assert "\n" not in line
    out = json.loads(line)
    assert out["msg"] == "step 3" and out["level"] == "INFO" and out["logger"] == "sara.trainer"
    assert (out["run"], out["worker_id"], out["batch_id"]) == ("ns1", "w7", "b42")
    assert out["step"] == 3 and out["policy_version"] == 2 and "unset" not in out
    assert out["ts"].endswith("+00:00")


def test_context_ends_with_its_block_and_extra_wins():
    fmt = JsonFormatter()
    with log_context(batch_id="outer"):
        assert json.loads(fmt.format(record(batch_id="own")))["batch_id"] == "own"
    assert "batch_id" not in json.loads(fmt.format(record()))


def test_exceptions_and_odd_values_stay_on_one_line():
    fmt = JsonFormatter({"run": object()})
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), None)
        import sys
        rec.exc_info = sys.exc_info()
    line = fmt.format(rec)
    assert line.count("\n") == 0 and "RuntimeError" in json.loads(line)["exc"]


@pytest.fixture
def root_handlers():
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    yield
    root.handlers[:] = saved
    root.setLevel(level)


def test_configure_from_env_writes_json_lines_to_stderr(root_handlers, monkeypatch):
    monkeypatch.setenv("SARA_LOG_FORMAT", "json")
    assert configure_logging("info", None, run="ns", worker_id="w1") == "json"
    configure_logging("info", None, run="ns", worker_id="w1")  # twice: still one handler
    (handler,) = logging.getLogger().handlers
    assert handler.stream is sys.stderr
    # the handler's own formatting, not a log call: in the full suite earlier tests leave global
    # logging state (disabled loggers, logging.disable, raiseExceptions) that is not this module's
    record = logging.LogRecord("sara.worker", logging.INFO, __file__, 1, "lease %s lost", ("l1",),
                               None)
    record.lease_id = "l1"
    line = handler.format(record)
    assert "\n" not in line
    assert json.loads(line) | {"ts": None} == {
        "ts": None, "level": "INFO", "logger": "sara.worker", "msg": "lease l1 lost",
        "run": "ns", "worker_id": "w1", "lease_id": "l1"}


def test_text_stays_the_default_and_unknown_formats_are_refused(monkeypatch):
    monkeypatch.delenv("SARA_LOG_FORMAT", raising=False)
    assert resolve_format(None) == "text" and resolve_format("JSON") == "json"
    with pytest.raises(ValueError):
        resolve_format("xml")


def test_cli_refuses_an_unknown_log_format(root_handlers):
    from typer.testing import CliRunner

    from sara_cli import main as cli

    out = CliRunner().invoke(cli.app, ["serve", "--log-format", "xml"])
    assert out.exit_code == 2 and "--log-format" in out.output
