"""The docs hold what they promise: `make help` names every target of the Makefile, the README
stays a front door, no page cites an issue number, every page is in the site's navigation,
and the few shell blocks the README test does not run say why."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.test_readme_walkthrough import DOCUMENTS, shell_blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# A tracker reference ("issue" and a number, or a "#" and a number in brackets): history that says nothing to a reader.
ISSUE_REFERENCE = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.IGNORECASE)


def makefile_targets() -> set[str]:
    """Every named target (not a file target such as $(VENV)/.installed, not .PHONY)."""
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9_-]*)\s*:(?!=)", text, flags=re.M))


def test_make_help_describes_every_target_of_the_makefile():
    done = subprocess.run(
        ["make", "--no-print-directory", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    described = set(re.findall(r"^make ([a-z][a-z0-9_-]*)", done.stdout, flags=re.M))
    targets = makefile_targets()
    assert {"run", "test", "lint", "docs", "help"} <= targets
    assert targets - described == set(), f"targets missing from `make help`: {sorted(targets - described)}"
    assert described - targets == set(), f"`make help` describes no such target: {sorted(described - targets)}"


def test_the_readme_is_a_front_door_of_at_most_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)


def test_no_page_of_the_docs_or_the_readme_cites_an_issue_number():
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in pages
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert found == [], "\n".join(found)


def nav_pages(entries: list) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            pages |= nav_pages(value)
        else:
            pages.add(value)
    return pages


def test_every_page_is_in_the_sites_navigation():
    """ADRs are reached from their generated index; every other page has a place in the nav."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if not p.relative_to(DOCS).parts[0].startswith("_")}
    orphans = {p for p in pages - listed if not p.startswith("adr/")}
    assert orphans == set(), f"pages missing from mkdocs.yml's nav: {sorted(orphans)}"
    # Generated at build time (docs/_hooks/generated.py), never kept in the tree.
    assert {"reference/openapi.md", "reference/command-line.md", "adr/index.md"} <= listed
    assert not (DOCS / "reference" / "openapi.md").exists()


def test_shell_blocks_left_out_of_the_readme_test_are_few_and_say_why():
    skipped = [(doc, block) for doc in DOCUMENTS for block in shell_blocks(doc) if block.not_run is not None]
    assert all(block.not_run.strip() for _, block in skipped), skipped
    assert len(skipped) <= 4, [(str(doc.relative_to(ROOT)), block.not_run) for doc, block in skipped]
    for doc in DOCUMENTS:
        assert any(block.not_run is None for block in shell_blocks(doc)), f"{doc}: no block runs"
