"""The README stays a short front page and every link in it and in docs/ leads somewhere real."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces become hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"),
                                                  flags=re.M | re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text(encoding="utf-8")))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: lead outside the repository


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_the_readme_links_every_docs_page_and_each_exists() -> None:
    linked = {t.partition("#")[0] for t in links(README)
              if t.startswith("docs/") and t.partition("#")[0].endswith(".md")}
    assert linked, "the README points into docs/"
    assert sorted(t for t in linked if not (ROOT / t).is_file()) == []
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= linked  # no docs page the README does not point to


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
    assert sum(len(links(p)) for p in PAGES) > 20  # the check saw the links it is about
