"""Every relative link of README.md and docs/*.md resolves: the file exists, and an
``#anchor`` names a heading of the page it points to (GitHub's heading ids). No database."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""<(?:img|a)\b[^>]*\b(?:src|href)=["']([^"']+)["']""")
EXTERNAL = ("http://", "https://", "mailto:", "ftp://")


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code (links there are code)."""
    kept: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[:3]
                continue
            if marker.group(1).startswith(fence):
                fence = None
                continue
        if fence is None:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    fence: str | None = None
    for line in path.read_text().splitlines():
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker:
            fence = None if fence else marker.group(1)[:3]
            continue
        if fence:
            continue
        heading = re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found |= set(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", path.read_text()))
    return found


def links(path: Path) -> list[str]:
    text = prose(path.read_text())
    return [*LINK.findall(text), *HTML_LINK.findall(text)]


def broken(path: Path) -> list[str]:
    problems: list[str] = []
    for target in links(path):
        if target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not destination.exists():
            problems.append(f"{target}: no {destination.relative_to(ROOT, walk_up=True)}")
            continue
        if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            problems.append(f"{target}: no heading #{anchor} in {destination.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    assert not broken(page), f"broken links in {page.relative_to(ROOT)}: {broken(page)}"


def test_every_docs_page_is_in_the_readme_map():
    readme = prose((ROOT / "README.md").read_text())
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(readme)}
    missing = [p.name for p in PAGES[1:] if p.name not in linked]
    assert not missing, f"docs pages the README's map does not link: {missing}"


def test_the_link_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## A `code` heading, twice\n\n## A `code` heading, twice\n\n"
        "[ok](#title) [ok](#a-code-heading-twice-1) [ok](page.md#a-code-heading-twice)\n"
        "[gone](missing.md) [no anchor](#nowhere) `[in code](missing2.md)`\n"
        '<img src="gone.png" alt="">\n```\n[in a block](missing3.md)\n```\n'
    )
    problems = broken(page)
    assert len(problems) == 3, problems
    assert any("missing.md" in p for p in problems)
    assert any("#nowhere" in p for p in problems)
    assert any("gone.png" in p for p in problems)
