"""`need(module, why)`: import an optional package a test needs; skip without it, but fail under
CI (`CI` set, as .ci/run does), whose install carries every one of them, so a test that CI is
meant to run can never turn into a skip there unnoticed."""

from __future__ import annotations

import importlib
import os

import pytest


def need(module: str, why: str):
    """The imported module; else pytest.skip(why), or pytest.fail(why) when $CI is set."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        message = f"{why} ({e})"
        if os.environ.get("CI"):
            pytest.fail(f"CI installs it, so this is a failure here: {message}")
        pytest.skip(message)
