"""The remote-worker client promises types (it ships ``py.typed``): mypy must agree."""

from __future__ import annotations

from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python" / "controlplane_client"


def test_the_client_type_checks():
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")
    out, err, status = api.run([str(CLIENT), "--no-error-summary", "--cache-dir", "/dev/null"])
    assert status == 0, out + err
