"""A host project for the benchmarks: ``startproject`` with the README's recipe, nothing else.

``bench/web.py --host-project`` serves this instead of the repository's own
``controlplane/``: the same lines a user adds (read from README.md by the
packaging tests' helpers, so the two cannot drift), plus the deployment values
every production settings file has (``DEBUG`` off, the allowed hosts, the
database from ``DATABASE_URL``). The control plane is mounted at ``/ops/``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.installed.host_project import HostProject, Venv, apply_readme  # noqa: E402

PREFIX = "/ops"
SETTINGS_MODULE = "mysite.settings"
WSGI_MODULE = "mysite.wsgi"
ASGI_APPLICATION = "mysite.asgi:application"

# What a deployment sets before the README's lines (the same for serve and the WSGI reference).
DEPLOYMENT = """
import os

import dj_database_url

DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
DATABASES = {
    "default": dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=600)
}
"""


def make_host_project(directory: Path) -> Path:
    """``mysite`` in ``directory`` (made afresh), edited as README.md says; the directory."""
    if directory.exists():
        subprocess.run(["rm", "-rf", str(directory)], check=True)
    directory.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(directory)], check=True
    )
    settings = directory / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + DEPLOYMENT)
    apply_readme(HostProject(directory, Venv(Path(sys.prefix))))
    return directory
