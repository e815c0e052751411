#!/usr/bin/env python3
"""Write `.env` for docker compose: a copy of `.env.example` with every empty role token filled
with a fresh random one. Tokens already set are kept, so running it again changes nothing.

    python3 scripts/init_env.py && docker compose up

Standard library only: it runs on the host before any image exists. The tokens are printed
nowhere; read them from `.env` (mode 0600) when a client needs one.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENS = ("SARA_WORKER_TOKEN", "SARA_TRAINER_TOKEN", "SARA_OPERATOR_TOKEN", "SARA_ADMIN_TOKEN")


def fill_tokens(text: str) -> tuple[str, list[str]]:
    """`text` with each empty ``NAME=`` line of a role token given a random value (a missing one
    appended); returns the new text and the names filled."""
    filled = []
    for name in TOKENS:
        pattern = re.compile(rf"^{name}=[ \t]*$", re.MULTILINE)
        if pattern.search(text):
            text = pattern.sub(f"{name}={secrets.token_urlsafe(32)}", text, count=1)
            filled.append(name)
        elif not re.search(rf"^{name}=\S", text, re.MULTILINE):
            text = text.rstrip("\n") + f"\n{name}={secrets.token_urlsafe(32)}\n"
            filled.append(name)
    return text, filled


def main(argv: list[str] | None = None) -> int:
    """Create or complete the env file; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", type=Path, default=ROOT / ".env")
    parser.add_argument("--example", type=Path, default=ROOT / ".env.example")
    args = parser.parse_args(argv)
    existed = args.env_file.exists()
    text = (args.env_file if existed else args.example).read_text()
    text, filled = fill_tokens(text)
    # 0600 from the start: the file holds every role's credentials
    fd = os.open(args.env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(args.env_file, 0o600)
    what = "completed" if existed else f"created from {args.example.name}"
    names = ", ".join(filled) or "none (all were set)"
    print(f"{args.env_file}: {what}; new tokens: {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
