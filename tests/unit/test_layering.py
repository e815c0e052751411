"""The packages' layering, read from their source with `ast` (nothing is imported):

    sara_cli  ->  sara_demo  ->  sara_trainer, sara_worker, sara_service, sara_integrations
                             ->  sara_client

and inside sara_service, http -> core -> store -> math;

- no import cycle between modules (function-level imports included: a lazy import still ties two
  modules together);
- no module imports another module's private (``_name``) functions, classes or constants;
- the libraries never import the CLI or the demo, and the demo never imports the CLI;
- the client SDK imports none of the other packages (one lazy exception, below).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"sara_cli": "cli", "sara_demo": "demo", "sara_service": "service",
            "sara_client": "client", "sara_worker": "worker", "sara_trainer": "trainer",
            "sara_integrations": "integrations"}
LIBRARIES = ("sara_service", "sara_client", "sara_worker", "sara_trainer", "sara_integrations")
# What each package may not import (its own layer and those above it).
FORBIDDEN = {
    **{lib: {"sara_cli", "sara_demo"} for lib in LIBRARIES},
    "sara_demo": {"sara_cli"},
    "sara_client": {"sara_cli", "sara_demo", "sara_service", "sara_worker", "sara_trainer",
                    "sara_integrations"},
    # the bridges to other libraries stand on the SDK alone
    "sara_integrations": {"sara_cli", "sara_demo", "sara_service", "sara_worker",
                          "sara_trainer"},
}
# sara_client.local() runs the scheduler in-process on request: it imports sara_service inside
# the function that needs it (documented as needing the service extra), never at module level.
LAZY_EXCEPTIONS = {("sara_client.local", "sara_service")}
# Private names one module may import from another: none.
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        base = ROOT / folder
        for path in sorted((base / package).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


class Import:
    """One imported module (and the names taken from it) at one place in one module."""

    def __init__(self, source: str, target: str, names: list[str], lazy: bool, line: int):
        self.source, self.target, self.names, self.lazy, self.line = (source, target, names,
                                                                      lazy, line)

    def __repr__(self) -> str:
        return f"{MODULES[self.source].relative_to(ROOT)}:{self.line} imports {self.target}"


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    lazy_nodes = {id(n) for f in ast.walk(tree)
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        lazy = id(node) in lazy_nodes
        if isinstance(node, ast.Import):
            out += [Import(module, a.name, [], lazy, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node, path.name == "__init__.py")
            submodules = [a.name for a in node.names if f"{target}.{a.name}" in MODULES]
            out += [Import(module, f"{target}.{n}", [], lazy, node.lineno) for n in submodules]
            names = [a.name for a in node.names if a.name not in submodules]
            if names or not submodules:
                out.append(Import(module, target, names, lazy, node.lineno))
    return out


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _project_target(name: str) -> str | None:
    """The project module `name` loads (its longest known prefix), or None."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def _cycles() -> list[list[str]]:
    graph = defaultdict(set)
    for imp in IMPORTS:
        target = _project_target(imp.target)
        if target is not None and target != imp.source:
            graph[imp.source].add(target)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def test_every_package_is_read():
    assert {m.split(".")[0] for m in MODULES} == set(PACKAGES)
    assert "sara_cli.main" in MODULES and "sara_demo.demo" in MODULES


def test_no_import_cycles_between_modules():
    assert _cycles() == []


def test_no_module_imports_another_modules_private_names():
    offences = [f"{imp!r}: {name}" for imp in IMPORTS if _project_target(imp.target)
                for name in imp.names
                if name.startswith("_") and not name.startswith("__")
                and _project_target(imp.target) != imp.source
                and (imp.source, imp.target, name) not in KNOWN_PRIVATE]
    assert offences == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_libraries_do_not_import_the_layers_above_them(package):
    offences = [repr(imp) for imp in IMPORTS
                if imp.source.split(".")[0] == package
                and imp.target.split(".")[0] in FORBIDDEN[package]
                and not (imp.lazy and (imp.source, imp.target.split(".")[0])
                         in LAZY_EXCEPTIONS)]
    assert offences == []


# The scheduler's layers, bottom to top (sara_service/<layer>/): a layer imports its own and
# those below it. The modules at the package's top (settings, errors, embedded) serve
# every layer and import none but the math; process.py, the process's main, stands above all.
SERVICE_LAYERS = ("math", "store", "core", "http")
SERVICE_MAIN = "sara_service.process"


def _service_layer(module: str) -> int | None:
    """The index of `module`'s layer in SERVICE_LAYERS; -1 for the shared top-level modules,
    None outside the service or for its main."""
    parts = module.split(".")
    if parts[0] != "sara_service" or module in (SERVICE_MAIN, "sara_service"):
        return None
    return SERVICE_LAYERS.index(parts[1]) if parts[1] in SERVICE_LAYERS else -1


def test_every_service_module_is_in_a_layer_or_shared():
    shared = {m for m in MODULES if _service_layer(m) == -1}
    assert shared == {"sara_service.settings", "sara_service.setting_groups",
                      "sara_service.retired_settings", "sara_service.strategy_settings",
                      "sara_service.errors",
                      "sara_service.embedded"}


def test_the_service_layers_import_only_downward():
    offences = []
    for imp in IMPORTS:
        target = _project_target(imp.target)
        source_layer = _service_layer(imp.source)
        target_layer = None if target is None else _service_layer(target)
        if source_layer is None or target_layer is None:
            continue
        allowed = (target_layer == -1 or target_layer <= source_layer
                   or (source_layer == -1 and target_layer == 0))   # shared -> math
        if not allowed:
            offences.append(repr(imp))
    assert offences == []


def test_the_checks_see_a_violation():
    """The reader itself: a relative import, a private name and a lazy import are all seen."""
    tree_imports = _imports("sara_cli.stats", MODULES["sara_cli.stats"])
    assert any(i.target == "sara_cli.common" for i in tree_imports)
    assert any(i.target == "sara_cli.watch" and i.lazy for i in tree_imports)
    assert _service_layer("sara_service.http.routers.prompts") > _service_layer(
        "sara_service.core.scheduler") > _service_layer("sara_service.math.allocation")
    lazy_local = [i for i in IMPORTS if i.source == "sara_client.local"
                  and i.target.startswith("sara_service")]
    assert lazy_local and all(i.lazy for i in lazy_local)
