"""The layout's rule: one concept per module, and a module past about 400 lines says why.

A module may be long when it is one concept (docs/architecture.md, "Reading the code"); then
its docstring (a Lua script's leading comments) carries a sentence with "past 400 lines".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("cli", "demo", "service", "worker", "trainer", "integrations", "client")
LIMIT = 400


def _modules() -> list[Path]:
    return [path for top in SOURCES for path in sorted((ROOT / top).rglob("*"))
            if path.suffix in (".py", ".lua")]


def _long_modules() -> list[Path]:
    return [path for path in _modules() if len(path.read_text().splitlines()) > LIMIT]


def _leading_text(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text)) or ""
    comments = []
    for line in text.splitlines():
        if line.startswith("--"):
            comments.append(line[2:])
        elif line.strip():
            break
    return " ".join(comments)


def test_the_walk_reads_python_and_lua_modules():
    # guards the walk itself, whatever the modules' sizes
    names = {p.name for p in _modules()}
    assert {"scheduler.py", "apply_results.lua"} <= names


@pytest.mark.parametrize("path", _long_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_past_400_lines_says_why(path):
    said = " ".join(_leading_text(path).lower().split())
    assert "past 400 lines" in said, (
        f"{path.relative_to(ROOT)} has {len(path.read_text().splitlines())} lines; its "
        "docstring should say why it is one concept past 400 lines")
