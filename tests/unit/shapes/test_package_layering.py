"""engine/, rollout/ and resharding/ form no import loop, and shapes/ stands below them (a static scan of imports).

Every import counts, also those inside functions and under TYPE_CHECKING: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import verl_like

ROOT = Path(verl_like.__file__).parent
WATCHED = ("engine", "rollout", "resharding", "shapes")


def _package_imports(package: str) -> set[str]:
    """The top-level verl_like packages (and modules) that any file of `package` imports."""
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[0] == "verl_like" and len(parts) > 1 and parts[1] != package:
                    found.add(parts[1])
    return found


def test_no_import_loop_between_engine_rollout_and_resharding() -> None:
    graph = {package: _package_imports(package) & set(WATCHED) for package in WATCHED}

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})) for nxt in graph[start])

    loops = [package for package in WATCHED if reaches(package, package)]
    assert not loops, f"package import loop through {loops}: {graph}"


def test_engine_and_rollout_do_not_import_resharding() -> None:
    for package in ("engine", "rollout"):
        assert "resharding" not in _package_imports(package), f"{package}/ imports resharding/"


def test_shapes_imports_no_other_verl_like_package() -> None:
    assert _package_imports("shapes") == set()
