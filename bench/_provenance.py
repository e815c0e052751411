"""Where a benchmark figure came from: the commit it ran on, for the header of a result file."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_state(paths: tuple[str, ...] = ("service", "client", "worker")) -> str:
    """``<short sha> (clean)``, or a note that `paths` hold uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", *paths], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if dirty:
        return f"{head} + uncommitted changes in {', '.join(p + '/' for p in paths)}"
    return f"{head} (clean)"
