#!/usr/bin/env python3
"""Container health check: GET one URL, healthy when it answers 2xx within the timeout.

Usage: sara-healthcheck [URL]. Without URL: $SARA_HEALTH_URL, else $SARA_URL + "/healthz" (the
scheduler a worker or trainer talks to: a client container is healthy while it can reach it).
Standard library only, so it runs in every image (python:3.11-slim has no curl).
"""

import os
import sys
import urllib.request


def main() -> int:
    url = (sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SARA_HEALTH_URL")
           or os.environ.get("SARA_URL", "http://127.0.0.1:8000").rstrip("/") + "/healthz")
    timeout = float(os.environ.get("SARA_HEALTH_TIMEOUT_S", "4"))
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            ok = 200 <= r.status < 300
    except Exception as exc:  # noqa: BLE001 - refused, timeout, 5xx (HTTPError): all unhealthy
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
