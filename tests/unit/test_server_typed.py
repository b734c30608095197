"""The server packages type-check clean under mypy: a unit test keeps them so.

``jobs.states.Status`` is an enum to mypy on purpose: a plain string where a
status belongs, or a nullable column read as an id, is caught here rather than
in a transition at run time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "workers", "dashboard", "controlplane")


def test_the_server_type_checks():
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")
    out, err, status = api.run(
        [
            *(str(ROOT / package) for package in PACKAGES),
            # The settings ([tool.mypy]) wherever pytest was started from.
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-error-summary",
            "--cache-dir",
            "/dev/null",
        ]
    )
    assert status == 0, out + err
