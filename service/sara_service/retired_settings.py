"""Settings taken off the user surface, with what to do instead.

Some stay fields a benchmark sets in its own process (settings.INTERNAL_SETTINGS); none is read
from the environment or offered as a flag.

A run that still sets one is told so once a process, for one release; then the name is simply
unknown (pydantic-settings ignores an unknown SARA_* variable).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger("sara.service")

RETIRED_SETTINGS: dict[str, str] = {
    "SARA_REDIS_EMBEDDED": "sara serve knows itself whether it started Redis (/stats "
                           "config.redis says which); unset it",
    "SARA_POSTERIOR_DECAY": "a posterior forgets by the pool's epochs, "
                            "SARA_POSTERIOR_HALF_LIFE; the per-version rule is kept for "
                            "bench/allocation.py's comparison only",
    "SARA_DPS_CENSORED": "DPS always reads an abandoned group as the prefix it saw; the "
                         "uncensored labels are kept for bench/allocation.py's comparison only",
    "SARA_WORK_FLOOR": "measured to fill the engine with groups that arrive too old "
                       "(docs/benchmarks.md, engine time); bench/engine_time.py --work-floor "
                       "still measures it",
}

_said: set[str] = set()   # what this process has said already


def retired_settings_in(environ: Mapping[str, str]) -> list[str]:
    """One message for each retired setting `environ` still sets."""
    return [f"{name} is no longer a setting and is ignored: {why}"
            for name, why in RETIRED_SETTINGS.items() if name in environ]


def say_retired(environ: Mapping[str, str]) -> None:
    """Log each retired setting `environ` sets, once a process."""
    for message in retired_settings_in(environ):
        if message not in _said:
            _said.add(message)
            log.warning("%s", message)
