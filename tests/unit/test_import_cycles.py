"""The core modules of ``jobs`` import each other without a cycle, lazy imports included.

A cycle (``claims`` → ``transitions`` → ``enqueue`` → ``operations`` → ``claims``
was one) is held together by imports hidden inside functions; this reads every
``from jobs.x import`` of the top-level modules, wherever it sits.
"""

from __future__ import annotations

import ast
from pathlib import Path

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in JOBS.glob("*.py"):
        module = f"jobs.{path.stem}"
        graph[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jobs."):
                target = ".".join(node.module.split(".")[:2])
                if (JOBS / f"{target.split('.')[1]}.py").exists() and target != module:
                    graph[module].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_core_modules_have_no_import_cycle():
    graph = _imports()
    assert {"jobs.claims", "jobs.transitions", "jobs.enqueue", "jobs.operations"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
