"""Small parsing helpers shared by the verifiers."""

from __future__ import annotations

import re

_WS = re.compile(r"\s+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
MAX_CHARS = 100_000  # verifiers look at no more than the last this-many characters


def tail(text: str) -> str:
    """The part of a completion a verifier reads (answers come last)."""
    return text[-MAX_CHARS:]


def normalize_ws(text: str) -> str:
    """Strip, and collapse every run of whitespace to one space."""
    return _WS.sub(" ", text).strip()


def answer_tag(text: str) -> str | None:
    """The content of the last ``<answer>…</answer>``, or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1] if found else None


def last_line(text: str) -> str:
    """The last non-empty line."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
