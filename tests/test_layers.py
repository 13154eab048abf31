"""The package's layers, from the imports of its source (``ast``, nothing imported): each module imports only
its own layer or a lower one (core < launch < data < transforms < checking < checkpoint < driver < the top level:
``__init__`` and ``plot``), TYPE_CHECKING and function-local imports included; no import cycle between modules; no
private name (``_x``) taken from another module; a private module (``_x.py``) imported only from its own folder; no
file name in two folders (a name means one thing).
``checking`` (``ct.check``) judges compositions of transforms through ``core``'s protocol and needs nothing of the
checkpoint or the driver: it sits above the transforms and below what may one day use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
# lowest first; anything else is the top level
LAYERS = ("core", "launch", "data", "transforms", "checking", "checkpoint", "driver")


def sources(root: Path = SRC) -> dict[str, str]:
    """Every module of composetrain under ``root``, by dotted name: its source."""
    found = {}
    for path in sorted((root / "composetrain").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path.read_text()
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def folder(module: str, modules: dict[str, str]) -> str:
    """The package a module lives in (a package's ``__init__`` lives in itself)."""
    return module if f"{module}.__init__" in modules or _is_package(module, modules) else module.rpartition(".")[0]


def _is_package(module: str, modules: dict[str, str]) -> bool:
    return any(other.startswith(module + ".") for other in modules)


def imports(module: str, source: str, modules: dict[str, str]) -> list[tuple[str, str | None, int]]:
    """(the composetrain module imported, the name taken from it or None, line) for every import in ``source``."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "composetrain"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = module if _is_package(module, modules) else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            if base.split(".")[0] != "composetrain":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:  # `from composetrain.transforms import _recompute`: a module
                    found.append((sub, None, node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
    return found


def problems(modules: dict[str, str]) -> list[str]:
    """Every breach of the layering in ``modules`` (dotted name: source), as sentences."""
    found = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, source in modules.items():
        for target, name, line in imports(module, source, modules):
            where = f"{module} (line {line}) imports {target}" + (f".{name}" if name else "")
            if target not in modules:
                found.append(f"{where}: no such module")
                continue
            if target != module:
                graph[module].add(target)
            if layer(target) > layer(module):
                found.append(f"{where}: an upward import ({LAYERS[layer(module)]} < {_name(layer(target))})")
            if name is not None and name.startswith("_") and not name.startswith("__"):
                found.append(f"{where}: a private name of another module")
            private = target.rpartition(".")[2].startswith("_") and not target.endswith("__init__")
            if private and folder(target, modules) != folder(module, modules):
                found.append(f"{where}: a private module, imported from outside its folder")
    found += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return found


def _name(index: int) -> str:
    return LAYERS[index] if index < len(LAYERS) else "the top level"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [[*group, group[0]] for group in groups]


def test_the_package_keeps_its_layers():
    assert problems(sources()) == []


def test_every_module_sits_in_a_layer_folder_or_is_the_top_level():
    top = {m for m in sources() if layer(m) == len(LAYERS)}
    assert top == {"composetrain", "composetrain.plot"}


def file_names_in_two_folders(modules: dict[str, str]) -> dict[str, list[str]]:
    """Each module file name (``__init__`` aside) that more than one folder holds: the folders."""
    folders: dict[str, list[str]] = {}
    for module in modules:
        parent, _, name = module.rpartition(".")
        if not _is_package(module, modules):
            folders.setdefault(name, []).append(parent)
    return {name: where for name, where in folders.items() if len(where) > 1}


def test_no_file_name_means_two_things_in_two_folders():
    assert file_names_in_two_folders(sources()) == {}
    planted = {**sources(), "composetrain.driver.format": ""}
    assert file_names_in_two_folders(planted) == {"format": ["composetrain.checkpoint", "composetrain.driver"]}


@pytest.mark.parametrize(
    ("module", "line", "says"),
    [
        ("composetrain.core.state", "from composetrain.driver.run import run", "an upward import (core < driver)"),
        ("composetrain.transforms.clip", "if False:\n    import composetrain.checkpoint.files", "an upward import"),
        ("composetrain.driver.run", "from composetrain.core.steps import _lift", "a private name of another module"),
        ("composetrain.driver.run", "from composetrain.transforms import _recompute", "outside its folder"),
        ("composetrain.core.batching", "from composetrain.core.protocol import Context", "import cycle"),
        ("composetrain.checking._peeling", "from composetrain.driver.run import run", "(checking < driver)"),
        ("composetrain.transforms.clip", "from composetrain.checking import check", "(transforms < checking)"),
        ("composetrain.driver.run", "from composetrain.checking import _result", "outside its folder"),
    ],
)
def test_a_planted_breach_is_found(module, line, says):
    modules = sources()
    planted = {**modules, module: modules[module] + "\n" + line + "\n"}
    assert any(says in problem for problem in problems(planted)), problems(planted)
