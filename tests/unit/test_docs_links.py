"""The documentation stands on its own: it cites no design file or folder outside the
repository, and every relative link in docs/ and README.md leads to a file (and, for a
Markdown target with a #fragment, a heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
# A design document that is not in the repository, cited by its upper-case name (with or
# without its extension, or as "<name> improvement N"), and the folder beside the checkout
# where it lives. The names are assembled so that this file does not cite them itself.
_DOC = "DES" + "IGN"
_FOLDER = "../" + "shared"
FORBIDDEN = {
    _DOC: re.compile(rf"\b{_DOC}\b"),
    _FOLDER: re.compile(re.escape(_FOLDER)),
}

# [text](target) and [text](target "title"); images too. Code spans and fenced blocks are
# removed first, so that examples of Markdown in code are not read as links.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def _prose(text: str) -> str:
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        slug = _slug(heading)
        n = 1
        unique = slug
        while unique in anchors:  # repeated headings get -1, -2, ...
            unique = f"{slug}-{n}"
            n += 1
        anchors.add(unique)
    return anchors


def _relative_links(path: Path) -> list[str]:
    links = _LINK.findall(_prose(path.read_text()))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


def test_the_docs_are_found():
    assert REPO / "README.md" in DOCS and len(DOCS) > 2


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_no_reference_outside_the_repository(path: Path):
    lines = path.read_text().splitlines()
    cited = {
        name: [i + 1 for i, line in enumerate(lines) if pattern.search(line)]
        for name, pattern in FORBIDDEN.items()
    }
    cited = {name: found for name, found in cited.items() if found}
    assert not cited, f"{path.relative_to(REPO)} cites (name: lines) {cited}"


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_relative_links_point_to_existing_files_and_headings(path: Path):
    broken = []
    for link in _relative_links(path):
        target, _, fragment = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link} (no file {file})")
        elif not file.is_relative_to(REPO):
            broken.append(f"{link} (outside the repository)")
        elif fragment and file.suffix == ".md" and fragment not in _anchors(file):
            broken.append(f"{link} (no heading #{fragment} in {file.relative_to(REPO)})")
    assert not broken, f"{path.relative_to(REPO)}: broken links: {broken}"


def test_the_checks_see_what_they_look_for():
    assert all(
        any(p.search(line) for p in FORBIDDEN.values())
        for line in (
            f"see {_DOC}.md",
            f"({_DOC} improvement 3)",
            f"{_DOC}: a rule",
            f"{_FOLDER}/x",
        )
    )
    assert not any(p.search("the design of the Lease") for p in FORBIDDEN.values())


def test_the_link_reader_sees_links_and_ignores_code():
    sample = 'See [a](a.md), ![b](img/b.png "B") and [c](https://x.y/z).\n`[d](d.md)`\n'
    assert _LINK.findall(_prose(sample)) == ["a.md", "img/b.png", "https://x.y/z"]
    assert _slug("In a cluster (`manifests/operator/`)") == "in-a-cluster-manifestsoperator"
    assert _slug("High availability (leader election)") == "high-availability-leader-election"
