"""`need(module, why)`: import an optional package a test needs; skip without it, but fail where
the install is known to carry it: under .ci/run (`CI_REQUIRE_OPTIONAL=1`) or any CI (`CI` set).
A test that CI is meant to run can then never turn into a skip there unnoticed."""

from __future__ import annotations

import importlib
import os

import pytest


def required() -> bool:
    return bool(os.environ.get("CI_REQUIRE_OPTIONAL") or os.environ.get("CI"))


def need(module: str, why: str):
    """The imported module; else pytest.skip(why), or pytest.fail(why) where `required()`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        message = f"{why} ({e})"
        if required():
            pytest.fail(f"CI installs it, so this is a failure here: {message}")
        pytest.skip(message, allow_module_level=True)   # at a module's top too
