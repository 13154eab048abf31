"""Count the `raise` statements of a folder whose message says what to do (the fix), as STYLE.md asks.

`python tools/fixes.py src/composetrain/data [-v]` prints "fixed/counted = percent" per folder (-v: each raise,
FIX or ---). The rule, from the source alone (``ast``, nothing imported):

- counted: a ``raise`` of a call whose arguments hold message text (a string or f-string); a bare re-raise, or a
  raise of an exception built elsewhere (``raise publish_error(path, e)``), is not a message and is not counted.
- the text: the literal parts, with a module-level string constant of the package put in for its name
  (``{CACHE}``, ``{REWRITE}``); any other field reads ``{}``.
- a fix: ``e.g.``, or an imperative verb opening a clause: at the start, or after ``;``, ``:``, ``(`` or ``.``, or
  after "or" / "then" (``pass rebuild=True``, ``give a folder inside it``, ``or leave it out``).

A heuristic: it finds the habit, not the quality of the advice. Read the -v listing to check it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

VERBS = [
    *("add", "call", "choose", "close", "convert", "copy", "create", "drop", "encode", "flatten", "free", "give"),
    *("import", "index", "install", "join", "keep", "leave", "let", "lower", "make", "move", "pad", "pass", "put"),
    *("raise", "remove", "rename", "replace", "reshape", "restore", "return", "store", "try", "use", "wrap", "write"),
]
FIX = re.compile(r"(?:^|[;:(.]\s*|\b(?:or|then)\s+)(?:" + "|".join(VERBS) + r")\b|\be\.g\.", re.IGNORECASE)
PACKAGE = Path(__file__).resolve().parent.parent / "src" / "composetrain"


def constants(root: Path = PACKAGE) -> dict[str, str]:
    """Every module-level ``NAME = "text"`` of the package, by name (a name given two texts is left out)."""
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            text = node.value.value if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) else None
            if isinstance(node, ast.Assign) and isinstance(text, str):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, set()).add(text)
    return {k: next(iter(v)) for k, v in found.items() if len(v) == 1}


def message(call: ast.Call, names: dict[str, str]) -> str:
    """The text of a raised call's message arguments ("" where there is none)."""
    parts: list[str] = []

    def text(node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            for value in node.values:
                text(value)
        elif isinstance(node, ast.FormattedValue):
            inner = node.value
            parts.append(names.get(inner.id, "{}") if isinstance(inner, ast.Name) else "{}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            text(node.left)
            text(node.right)

    for arg in call.args:
        text(arg)
    return "".join(parts) if any(not p.startswith("{") for p in parts) else ""


def raises(folder: Path, names: dict[str, str]) -> list[tuple[str, int, str, bool]]:
    """(file, line, message, gives a fix) for every counted raise under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                text = message(node.exc, names)
                if text:
                    found.append((path.name, node.lineno, text, bool(FIX.search(text))))
    return sorted(found)


def main(argv: list[str]) -> None:
    names = constants()
    for folder in [a for a in argv if a != "-v"]:
        found = raises(Path(folder), names)
        fixed = sum(f for *_, f in found)
        if "-v" in argv:
            for file, line, text, fix in found:
                print(f"{'FIX' if fix else '---'} {file}:{line}: {text[:160]}")
        print(f"{folder}: {fixed}/{len(found)} = {fixed / max(1, len(found)):.0%}")


if __name__ == "__main__":
    main(sys.argv[1:])
