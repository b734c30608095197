"""The core does not import its faces: nothing under ``jobs/`` or ``workers/`` imports
``dashboard`` but the composition root that mounts every face's routes."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Where the faces are put together; it moves out of jobs/ on its own.
COMPOSITION_ROOTS = {Path("jobs/routing.py")}


def dashboard_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "dashboard" or name.startswith("dashboard.") for name in names):
            lines.append(node.lineno)
    return lines


def test_the_core_imports_no_dashboard_module() -> None:
    found = {}
    for package in ("jobs", "workers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative in COMPOSITION_ROOTS:
                continue
            if lines := dashboard_imports(path):
                found[str(relative)] = lines
    assert found == {}, f"jobs/ and workers/ import the dashboard: {found}"
