"""List every function longer than a limit (default 40 lines, ``def`` to last line, docstring
and signature included) in the project's packages, longest first.

    python scripts/long_functions.py [--limit 40] [--body] [folders ...]

``--body`` counts from the first statement after the docstring instead, so a typer command's
option table (its signature) and its help text do not count.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("cli", "demo", "service", "client", "worker", "trainer")


def _body_start(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    has_doc = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
               and isinstance(body[0].value.value, str))
    return body[1].lineno if has_doc and len(body) > 1 else body[0].lineno


def long_functions(folders: list[Path], limit: int, body: bool) -> list[tuple[int, str]]:
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    start = _body_start(node) if body else node.lineno
                    length = node.end_lineno - start + 1
                    if length > limit:
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        found.append((length, f"{where} {node.name}"))
    return sorted(found, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--body", action="store_true")
    parser.add_argument("folders", nargs="*", default=list(FOLDERS))
    args = parser.parse_args()
    for length, where in long_functions([ROOT / f for f in args.folders], args.limit, args.body):
        print(f"{length:4d}  {where}")


if __name__ == "__main__":
    main()
