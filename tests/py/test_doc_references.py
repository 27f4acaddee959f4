"""A page that sends the reader to a section of another page names one that exists: the
references written as `page.md, "Section"` (or `README, "Section"`) resolve to a heading or
a bold lead of that page, and the links `[…](page.md#anchor)` in README.md and docs/ to a
heading of the page linked."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `README, "A complete psql session"`, `[benchmarks.md](benchmarks.md), "Flush cadence"`
NAMED = re.compile(r'\b(README|[\w-]+\.md)\]?(?:\([^)\s]*\))?,?\s+"([^"\n]{3,80})"')
LINKED = re.compile(r"\]\(((?:\.\./)?(?:docs/)?[\w-]+\.md)#([\w-]+)\)")


def _target(page: Path, name: str) -> Path:
    if name == "README":
        return ROOT / "README.md"
    here = (page.parent / name).resolve()
    return here if here.exists() else ROOT / "docs" / Path(name).name


def _headings(path: Path) -> set[str]:
    return {h.strip() for h in re.findall(r"(?m)^#+ (.+)$", path.read_text())}


def _sections(path: Path) -> set[str]:
    """Headings, and the bold lead of a paragraph or list item (`**What is embedded**`)."""
    leads = re.findall(r"(?m)^(?:- )?\*\*([^*\n]+)\*\*", path.read_text())
    return _headings(path) | {lead.strip() for lead in leads}


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-")


def test_a_named_section_is_a_heading_of_the_page_named() -> None:
    broken = []
    for page in PAGES:
        text = re.sub(r"\s*\n\s*", " ", page.read_text())  # a reference may wrap
        for name, section in NAMED.findall(text):
            target = _target(page, name)
            if not target.exists() or not any(
                re.match(re.escape(section) + r"(\W|$)", h) for h in _sections(target)
            ):
                broken.append(f'{page.relative_to(ROOT)}: {name}, "{section}"')
    assert broken == []


def test_a_linked_anchor_is_a_heading_of_the_page_linked() -> None:
    broken = []
    for page in PAGES:
        for name, anchor in LINKED.findall(page.read_text()):
            target = _target(page, name)
            if not target.exists() or anchor not in {_slug(h) for h in _headings(target)}:
                broken.append(f"{page.relative_to(ROOT)}: {name}#{anchor}")
    assert broken == []
