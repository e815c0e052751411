"""Per-worker credentials: tokens derived from one secret (`SARA_WORKER_SECRET`), each bound to
one worker id.

A worker's token is `<worker id>.<HMAC-SHA256(secret, "sara-worker:" + worker id) in hex>`: the
scheduler recomputes it from the id the token names, so it keeps no list of workers, and a token
lets its bearer act as that worker only (lease, heartbeat, report, release). `sara worker-token ID`
prints one.
"""

from __future__ import annotations

import hashlib
import hmac


def worker_token(secret: str, worker_id: str) -> str:
    """The token of `worker_id` under `secret`."""
    mac = hmac.new(secret.encode(), b"sara-worker:" + worker_id.encode(), hashlib.sha256)
    return f"{worker_id}.{mac.hexdigest()}"


def worker_of(secret: str, token: str) -> str | None:
    """The worker id a token was derived for under `secret`, or None if it was not."""
    worker_id, dot, _ = token.rpartition(".")
    if not dot or not worker_id:
        return None
    expected = worker_token(secret, worker_id)
    return worker_id if hmac.compare_digest(expected.encode(), token.encode()) else None
