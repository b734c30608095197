"""docs/configuration.md against the knobs' single source, ``jobs.conf.DEFAULTS``.

The "Knobs" section of the page is a set of markdown tables, ``| name | default |
what it does |``, one row per knob. Every knob of ``DEFAULTS`` has exactly one row, every
row names a knob, and the default written there (the first backquoted value of the cell,
as JSON) is the code's. The dashboard's tunables are held to ``dashboard.conf.DEFAULTS``
the same way, and every knob name the docs spell out (``CONTROLPLANE["NAME"]``,
``CONTROLPLANE_NAME``) exists. No database.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dashboard.conf import DEFAULTS as DASHBOARD_DEFAULTS
from jobs.conf import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
HEADER = ["name", "default", "what it does"]

# Settings read outside ``jobs.conf`` (documented under "Other settings and environment
# variables"), and CONTROLPLANE_* names that are not settings at all.
ELSEWHERE = {"QUEUE_SHARDS"}
NOT_KNOBS = {"APPS", "TOKEN", "CONFIGURED"}
NOT_KNOB_PREFIXES = ("TEST_",)


def section(text: str, heading: str) -> str:
    """The body of the section whose heading line is ``heading``, up to the next heading
    of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)  # ValueError: the heading is gone
    body = []
    for line in lines[start + 1 :]:
        hashes = len(line) - len(line.lstrip("#"))
        if 0 < hashes <= level and line[hashes : hashes + 1] == " ":
            break
        body.append(line)
    return "\n".join(body)


def cells(line: str) -> list[str]:
    # A pipe inside backquotes would split a cell: the pages write none in these tables.
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_rows(text: str, header: list[str]) -> list[list[str]]:
    """The rows of every table in ``text`` whose header row is ``header``."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        row = cells(line)
        if row == header:
            inside = True
            continue
        if inside and not set("".join(row)) <= set("-: "):
            assert len(row) == len(header), f"a row with {len(row)} cells: {line}"
            rows.append(row)
    return rows


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def documented(text: str, header: list[str] = HEADER) -> dict[str, tuple[str, str]]:
    """``{name: (default cell, description)}``, failing on a name listed twice."""
    found: dict[str, tuple[str, str]] = {}
    for name_cell, default_cell, description in table_rows(text, header):
        spans = code_spans(name_cell)
        assert len(spans) == 1 and name_cell == f"`{spans[0]}`", f"name cell {name_cell!r}"
        name = spans[0]
        assert name not in found, f"{name} is listed twice"
        found[name] = (default_cell, description)
    return found


def written_default(cell: str) -> Any:
    spans = code_spans(cell)
    assert spans, f"no backquoted default in {cell!r}"
    return json.loads(spans[0])


def same_value(written: Any, actual: Any) -> bool:
    if isinstance(actual, bool) or isinstance(written, bool):
        return type(written) is type(actual) and written == actual
    if isinstance(actual, (int, float)):
        return isinstance(written, (int, float)) and written == actual
    return type(written) is type(actual) and written == actual


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


@pytest.fixture(scope="module")
def knobs(page) -> dict[str, tuple[str, str]]:
    return documented(section(page, "## Knobs"))


def test_every_knob_is_documented(knobs):
    missing = sorted(set(DEFAULTS) - set(knobs))
    assert not missing, f"knobs of jobs/conf.py missing from docs/configuration.md: {missing}"


def test_every_documented_knob_exists(knobs):
    unknown = sorted(set(knobs) - set(DEFAULTS))
    assert not unknown, f"docs/configuration.md lists knobs jobs/conf.py lacks: {unknown}"


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_documented_default_is_the_codes(knobs, name):
    if name not in knobs:
        pytest.skip("not documented (reported by test_every_knob_is_documented)")
    default_cell, description = knobs[name]
    written = written_default(default_cell)
    assert same_value(written, DEFAULTS[name]), (
        f"{name}: the page says {written!r}, jobs/conf.py has {DEFAULTS[name]!r}"
    )
    assert len(description.split()) >= 4, f"{name}: say what it does, not {description!r}"


def test_the_dashboard_tunables_match_dashboard_conf(page):
    listed = documented(section(page, "### Dashboard tunables"))
    expected = {f"DASHBOARD_{name}": value for name, value in DASHBOARD_DEFAULTS.items()}
    assert set(listed) == set(expected)
    for name, (default_cell, description) in listed.items():
        written = written_default(default_cell)
        assert same_value(written, expected[name]), f"{name}: {written!r} != {expected[name]!r}"
        assert description, name


def test_settings_read_elsewhere_are_not_knobs():
    assert not ELSEWHERE & set(DEFAULTS), "documented twice: move it to the knob tables"


def docs_text() -> dict[str, str]:
    pages = {path.relative_to(ROOT).as_posix(): path for path in (ROOT / "docs").glob("*.md")}
    pages["README.md"] = ROOT / "README.md"
    return {name: path.read_text() for name, path in sorted(pages.items())}


def test_knob_names_in_the_docs_exist(page):
    """A knob spelled in any page (``CONTROLPLANE["X"]``, ``"X":`` in a ``CONTROLPLANE = {``
    line, or ``CONTROLPLANE_X``) is a knob, or one of the other variables the page lists."""
    other = section(page, "## Other settings and environment variables")
    env_listed = set(re.findall(r"CONTROLPLANE_([A-Z][A-Z0-9_]*)", other))
    wrong: list[str] = []
    for name, text in docs_text().items():
        keys = set(re.findall(r'CONTROLPLANE\[\s*"([A-Z][A-Z0-9_]*)"', text))
        for line in re.findall(r"CONTROLPLANE = \{.*", text):
            keys |= set(re.findall(r'"([A-Z][A-Z0-9_]*)":', line))
        for key in sorted(keys - set(DEFAULTS) - ELSEWHERE):
            wrong.append(f'{name}: CONTROLPLANE["{key}"]')
        for var in sorted(set(re.findall(r"CONTROLPLANE_([A-Z][A-Z0-9_]*)", text))):
            if var in DEFAULTS or var in env_listed or var in NOT_KNOBS:
                continue
            if var.startswith(NOT_KNOB_PREFIXES):
                continue
            wrong.append(f"{name}: CONTROLPLANE_{var}")
    assert not wrong, f"names that are no knob (jobs/conf.py) nor listed in {PAGE.name}: {wrong}"
