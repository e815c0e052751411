"""GET /dashboard: a self-contained live page over /stats, and its static assets.

Auth. With no role tokens configured the page is open, like every route. With tokens, the page
itself needs an operator or admin token, given either as ``Authorization: Bearer <token>`` or as
``?token=<token>`` (a browser cannot set a header when you type a URL). The page's script keeps
the token in ``sessionStorage`` and sends it as a Bearer header on every ``/stats`` poll; /stats
then applies its own role check. The assets under ``/dashboard/static/`` hold no data and are
served without a token, so ``<script src>`` and ``<link href>`` work without one.

The token never reaches a log: uvicorn's access log line is the request path *with* its query,
so a filter on the ``uvicorn.access`` logger (installed when this module is imported) replaces
with ``***`` the value of every parameter whose name, percent-decoded, says token (``token=``,
``tok%65n=``, ``TOKEN=``: the server decodes names, so the filter must too). The page answers with
``Referrer-Policy: no-referrer`` and ``Cache-Control: no-store`` so the URL holding the token is
neither forwarded nor cached, and with a Content-Security-Policy that allows only this origin.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote_plus

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse, Response


from ..deps import NON_JSON_AUTH_RESPONSES, Credentials, SettingsDep, check_role
from ...errors import NotFound

router = APIRouter(tags=["operator"])

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
DASHBOARD_ROLES = frozenset({"operator", "admin"})
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
}

_QUERY = re.compile(r"\?([^\s#\"']*)")
_PARAM_SEPARATORS = re.compile(r"([&;])")


def _names_a_token(name: str) -> bool:
    """True when a query parameter name, once percent- and plus-decoded (up to three times:
    the server decodes once, a proxy may decode again), says token in any case."""
    for _ in range(3):
        if "token" in name.lower():
            return True
        decoded = unquote_plus(name)
        if decoded == name:
            return False
        name = decoded
    return "token" in name.lower()


def _redact_query(match: re.Match) -> str:
    parts = _PARAM_SEPARATORS.split(match.group(1))
    for i in range(0, len(parts), 2):  # odd positions hold the separators themselves
        name, eq, _ = parts[i].partition("=")
        if eq and _names_a_token(name):
            parts[i] = f"{name}=***"
    return "?" + "".join(parts)


def redact(text: str) -> str:
    """``text`` with the value of every query parameter whose decoded name says token (``token=``,
    ``tok%65n=``, ``TOKEN=`` ...) replaced by ``***``."""
    return _QUERY.sub(_redact_query, text) if "?" in text else text


class RedactTokenFilter(logging.Filter):
    """Blanks token values in log records (uvicorn's access log passes the path as an arg)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def install_log_redaction(logger_name: str = "uvicorn.access") -> None:
    """Add the redacting filter to ``logger_name`` once (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactTokenFilter) for f in logger.filters):
        logger.addFilter(RedactTokenFilter())


install_log_redaction()


def require_dashboard(settings: SettingsDep, creds: Credentials,
                      token: Annotated[str | None, Query(
                          description="Operator or admin token, for a browser that cannot send "
                                      "a header; the page then sends it as a Bearer header.")
                      ] = None) -> str | None:
    """Operator or admin, by Bearer header or ``?token=``; open when no tokens are configured."""
    if not settings.auth_enabled:
        return None
    given = creds.credentials if creds is not None else token
    role, _ = check_role(settings, given, DASHBOARD_ROLES, "open the dashboard",
                         missing="missing token: open /dashboard?token=<operator token> or send "
                                 "'Authorization: Bearer <token>'")
    return role


@router.get("/dashboard", response_class=HTMLResponse,
            dependencies=[Depends(require_dashboard)],
            responses={200: {"content": {"text/html": {}}, "description": "The dashboard page"},
                       **NON_JSON_AUTH_RESPONSES})
async def dashboard() -> HTMLResponse:
    """A live page of /stats: efficiency against Dynamic Sampling, decisions per second, the
    abandonment histogram, queues, workers, batches and the configuration in force."""
    html = (STATIC_DIR / "dashboard.html").read_text(encoding="utf-8")
    return HTMLResponse(html, headers=PAGE_HEADERS)


@router.get("/dashboard/static/{name}", include_in_schema=False)
async def dashboard_asset(name: str) -> Response:
    """The dashboard's script and stylesheet (no data in them: served without a token)."""
    media_type = ASSETS.get(name)
    if media_type is None:  # a fixed list of names: no path from the request reaches the disk
        raise NotFound("unknown_asset", f"no dashboard asset named {name!r}")
    return Response((STATIC_DIR / name).read_bytes(), media_type=media_type,
                    headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
