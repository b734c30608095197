"""The layer contracts in pyproject.toml hold: the core (jobs, workers) imports no face.

import-linter reads every import, those inside functions included, so a lazy
import cannot hide an arrow from the core into the dashboard, the REST API,
the remote-worker protocol, web serving, the admin or the commands.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layer_contracts_are_kept() -> None:
    run = lint_imports()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_a_module_importing_what_a_contract_forbids_breaks_it(tmp_path: Path) -> None:
    """The contracts can fail: the URLconf imports the REST API, so forbidding that breaks."""
    config = tmp_path / "layers.ini"
    config.write_text(
        "[importlinter]\n"
        "root_packages =\n    jobs\n    django_controlplane\n"
        "[importlinter:contract:probe]\n"
        "name = probe\n"
        "type = forbidden\n"
        "source_modules =\n    django_controlplane.urls\n"
        "forbidden_modules =\n    django_controlplane.api\n"
    )
    run = lint_imports("--config", str(config))
    assert run.returncode != 0
    assert "BROKEN" in run.stdout
