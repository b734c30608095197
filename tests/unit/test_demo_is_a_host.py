"""``controlplane/`` is a host project built from the README's recipe and nothing private.

Every test and benchmark of this repository runs ``controlplane/``; these
checks keep it what a user's project gets: its ``asgi.py`` and ``urls.py`` are
the README's blocks (the prefix and project name aside), its settings end with
the README's ``configure`` lines and set nothing but what ``startproject``
writes and deployment values, and nothing in it reaches into the packages.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
SECTION = README[README.index("## Adding it to your Django project") :]
SECTION = SECTION[: SECTION.index("\n## ", 10)]
BLOCKS = re.findall(r"```python\n(.*?)```", SECTION, flags=re.DOTALL)
DEMO = ROOT / "controlplane"

# What startproject's settings.py assigns, and the deployment values this project adds.
STARTPROJECT_NAMES = {
    "BASE_DIR", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "INSTALLED_APPS", "MIDDLEWARE",
    "ROOT_URLCONF", "TEMPLATES", "WSGI_APPLICATION", "DATABASES", "AUTH_PASSWORD_VALIDATORS",
    "LANGUAGE_CODE", "TIME_ZONE", "USE_I18N", "USE_TZ", "STATIC_URL", "DEFAULT_AUTO_FIELD",
}  # fmt: skip
DEPLOYMENT_NAMES = {"DATA_UPLOAD_MAX_MEMORY_SIZE", "TASKS", "CONTROLPLANE"}
PUBLIC_IMPORTS = {"os", "pathlib", "dj_database_url", "django_controlplane", "django"}


def block(marker: str) -> str:
    (found,) = [b for b in BLOCKS if marker in b]
    return found


def code_lines(text: str) -> list[str]:
    """Statements only: no docstring, comments or blank lines."""
    tree = ast.parse(text)
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) else tree.body
    return [ast.unparse(node) for node in body]


def test_asgi_is_the_readme_block() -> None:
    readme = block("django_controlplane.asgi").replace("mysite.settings", "controlplane.settings")
    assert code_lines((DEMO / "asgi.py").read_text()) == code_lines(readme)


def test_urls_are_the_readme_block_at_the_root() -> None:
    readme = block('include("django_controlplane.urls")').replace('path("ops/"', 'path(""')
    assert code_lines((DEMO / "urls.py").read_text()) == code_lines(readme)


def test_settings_are_startproject_and_deployment_values_then_the_readme_lines() -> None:
    source = (DEMO / "settings.py").read_text()
    tree = ast.parse(source)
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert assigned - STARTPROJECT_NAMES - DEPLOYMENT_NAMES == set()
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported - {"__future__"} <= PUBLIC_IMPORTS, imported
    readme = code_lines(block("configure(globals())"))
    configure_call = readme[-1]
    assert code_lines(source)[-1] == configure_call
    assert "import django_controlplane" in readme


def test_the_project_has_no_app_configs_templates_or_start_up_tricks_of_its_own() -> None:
    assert sorted(p.name for p in DEMO.glob("*.py")) == [
        "__init__.py", "asgi.py", "settings.py", "urls.py", "wsgi.py",
    ]  # fmt: skip
    assert not (ROOT / "templates").exists()
    manage = (ROOT / "manage.py").read_text()
    assert "gc." not in manage and "import gc" not in manage
    assert not list(Path(DEMO).glob("templates"))
