"""One log formatter for the service, the worker and the trainer: text, or one JSON object per
line (``SARA_LOG_FORMAT=json`` / ``--log-format json``) for log shippers.

Stdlib logging only. The run (namespace), worker and batch ids are fields, not words in the
message, so a log pipeline can filter on them: set once for a process with
``configure_logging(..., run=..., worker_id=...)``, for a stretch of code with
``log_context(batch_id=...)``, or for one line with ``extra={"batch_id": ...}``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
from datetime import datetime, timezone
from typing import Any, Iterator

# the fields a record may carry (by `extra`, context or the process); others stay out of the line
FIELDS = ("run", "worker_id", "batch_id", "lease_id", "step", "policy_version")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# no default (it would be one dict shared by every context): readers pass a fresh empty one
_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("sara_log_context")


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add `fields` (see FIELDS) to every JSON line logged inside the block, in this task or
    thread only (a contextvar, so concurrent requests do not mix)."""
    token = _context.set({**_context.get({}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: ts, level, logger, msg, the known id fields, exc."""

    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = {k: v for k, v in (static or {}).items() if v is not None}

    def format(self, record: logging.LogRecord) -> str:
        """The record, its context and the process' fields, on one line."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        out.update(self.static)
        out.update(_context.get({}))
        out.update({f: getattr(record, f) for f in FIELDS if getattr(record, f, None) is not None})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        # default=str: an id or value that is not JSON (a Path, an enum) must not lose the line
        return json.dumps(out, default=str, ensure_ascii=False)


def resolve_format(given: str | None) -> str:
    """The format to use: `given`, else SARA_LOG_FORMAT, else text. ValueError if unknown."""
    fmt = (given or os.environ.get("SARA_LOG_FORMAT") or "text").strip().lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return fmt


def configure_logging(level: str = "info", fmt: str | None = None, **static: Any) -> str:
    """Send the root logger to stderr as text or JSON lines (`static`: fields every JSON line
    carries, e.g. run=<namespace>, worker_id=...). Replaces earlier handlers, so calling it
    twice does not double lines. Returns the format chosen."""
    fmt = resolve_format(fmt)
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(static) if fmt == "json"
                         else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return fmt
