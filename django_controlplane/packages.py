"""The control plane's top-level packages, and the project packages that could hide them.

The packages are named ``jobs``, ``workers`` and ``dashboard``. A project that
has a package of one of those names beside its ``manage.py`` (``startapp
jobs``) comes first on ``sys.path``, so ``import jobs`` would load the
project's package and the control plane would fail much later with an error
that names neither (an import error, or "Application labels aren't unique").
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

PACKAGES = ("jobs", "workers", "dashboard")


class ShadowedPackage(ImproperlyConfigured):
    """A project package has the name of one of the control plane's packages."""


def _location(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve() if spec.origin else None


def shadowing_packages() -> list[tuple[str, Path | None]]:
    """Each of our package names that resolves somewhere else than beside this package."""
    home = Path(__file__).resolve().parent.parent
    found: list[tuple[str, Path | None]] = []
    for name in PACKAGES:
        location = _location(name)
        if location is None or location.parent != home:
            found.append((name, location))
    return found


def ensure_not_shadowed() -> None:
    """Stop with one clear error when a project package hides one of ours."""
    clashes = shadowing_packages()
    if not clashes:
        return
    name, location = clashes[0]
    where = f"at {location}" if location else "nowhere (it is not installed)"
    raise ShadowedPackage(
        f"The control plane's package {name!r} is hidden: 'import {name}' finds {where}, "
        f"not the package installed with django_controlplane "
        f"({Path(__file__).resolve().parent.parent}). "
        f"A package of your project named {name!r} comes first on sys.path. Rename it "
        f"(for example to 'my{name}': the folder, its AppConfig.name and every import of it); "
        f"the control plane's own packages {', '.join(PACKAGES)} cannot be renamed. "
        "App labels do not clash: ours are controlplane, controlplane_workers and "
        "controlplane_dashboard."
    )
