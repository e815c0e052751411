"""`sara serve` with settings a benchmark sets that a user cannot (sara_service.settings.
INTERNAL_SETTINGS: never read from SARA_* nor offered as flags):

    python bench/_serve_internal.py '{"work_floor": 2.0}' serve --port 8000 ...

The JSON gives the internal fields; the rest is `sara`'s command line as usual.
"""

from __future__ import annotations

import json
import sys

from sara_service import settings as service_settings


def main(argv: list[str]) -> None:
    internal = json.loads(argv[0])
    unknown = set(internal) - service_settings.INTERNAL_SETTINGS
    if unknown:
        sys.exit(f"not internal settings: {', '.join(sorted(unknown))} (use sara serve's flags)")
    base = service_settings.Settings

    class WithInternal(base):  # type: ignore[valid-type,misc]
        def __init__(self, **given):   # the command's own settings win
            super().__init__(**{**internal, **given})

    service_settings.Settings = WithInternal   # `sara serve` looks it up when it runs
    from sara_cli.main import main as sara

    sys.argv = ["sara", *argv[1:]]
    sara()


if __name__ == "__main__":
    main(sys.argv[1:])
