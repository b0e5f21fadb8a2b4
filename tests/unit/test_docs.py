"""Every relative link in README.md and docs/**/*.md resolves: the file (or directory) exists and,
with a ``#anchor``, the target Markdown file has a heading whose GitHub slug is that anchor. And every
``docs/<page>.md#anchor`` that a comment or docstring in the code cites resolves the same way.

Links inside fenced code blocks and inline code are not links. External links (``https:``,
``mailto:``...) are not checked: this suite runs without a network. The checker's own tests below
show it catching a missing file, a missing anchor and a link into a non-Markdown file's anchor.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold one level of brackets (an image).
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            if fenced is None:
                fenced = m.group(1)
            elif fenced == m.group(1):
                fenced = None
            continue
        if fenced is None:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: inline markup reduced to its text, lower case, every
    character that is not a letter, digit, space, hyphen or underscore dropped, spaces -> hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images -> their text
    text = re.sub(r"<[^>]+>", "", text)  # html tags
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file: heading slugs (repeats get -1, -2, ... as on GitHub) and
    explicit ``<a name=...>`` / ``<a id=...>``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        found.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}-{seen[slug]}"
        else:
            seen[slug] = 0
        found.add(slug)
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the file's prose."""
    out = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        prose = _INLINE_CODE.sub("", line)
        out.extend((number, target) for target in _INLINE_LINK.findall(prose))
        ref = _REF_DEF.match(prose)
        if ref:
            out.append((number, ref.group(1)))
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """A message per relative link of ``path`` that does not resolve."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for number, target in links(path):
        if _SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        where = f"{path.relative_to(root)}:{number}: ({target})"
        if not dest.exists():
            problems.append(f"{where} -> {file_part} does not exist")
            continue
        if not anchor:
            continue
        if dest.suffix != ".md":
            problems.append(f"{where} -> #{anchor} points into {dest.name}, which has no headings")
            continue
        if dest not in cache:
            cache[dest] = anchors(dest)
        if anchor not in cache[dest]:
            problems.append(f"{where} -> no heading '#{anchor}' in {dest.relative_to(root)}")
    return problems


# ------------------------------------------------------------------------------ the repository


def test_docs_exist():
    files = markdown_files()
    assert (ROOT / "docs" / "README.md") in files
    assert all(f.exists() for f in files), [str(f) for f in files if not f.exists()]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_readme_links_into_docs():
    targets = {t for _, t in links(ROOT / "README.md")}
    assert any(t.startswith("docs/") for t in targets), "README.md should say where to read next"


# ------------------------------------------------------------------------------ the checker


def test_github_slugs():
    assert github_slug("KIP-107: DeleteRecords and the low watermark") == "kip-107-deleterecords-and-the-low-watermark"
    assert github_slug("Records of `__consumer_offsets`") == "records-of-__consumer_offsets"
    assert github_slug("cluster.json") == "clusterjson"
    assert github_slug("The main job: make demo") == "the-main-job-make-demo"
    assert github_slug("[Linked](x.md) heading") == "linked-heading"


def _write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_checker_reports_missing_files_and_anchors(tmp_path):
    _write(tmp_path, "docs/target.md", "# Target\n\n## A section\n\n## A section\n\nbody\n")
    _write(tmp_path, "docs/data.txt", "plain\n")
    page = _write(tmp_path, "README.md", "\n".join([
        "# Page",
        "[ok](docs/target.md) [ok anchor](docs/target.md#a-section) [repeat](docs/target.md#a-section-1)",
        "[self](#page) ![image](docs/data.txt) [web](https://example.com/x.md#nope)",
        "[gone](docs/missing.md)",
        "[bad anchor](docs/target.md#no-such-section)",
        "[into text](docs/data.txt#line)",
        "[self bad](#nowhere)",
        "`[in code](docs/missing-in-code.md)`",
        "```",
        "[in a fence](docs/missing-in-fence.md)",
        "```",
        "[ref]: docs/missing-ref.md",
    ]) + "\n")
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "README.md:4: (docs/missing.md) -> docs/missing.md does not exist" in text
    assert "no heading '#no-such-section' in docs/target.md" in text
    assert "#line points into data.txt" in text
    assert "no heading '#nowhere' in README.md" in text
    assert "docs/missing-ref.md does not exist" in text
    assert "in-code" not in text and "in-fence" not in text


# ------------------------------------------------------------------------------ citations in code

_CITATION = re.compile(r"docs/([\w./-]+\.md)(?:#([\w-]+))?")
_CITING_DIRS = ("services", "tests", "spark-jobs", "charts", "scripts")
_CITING_SUFFIXES = {".py", ".c", ".h", ".yaml", ".yml", ".tpl", ".sh", ".md", ".txt"}


def cited_docs(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(file:line, page, anchor) of every ``docs/<page>.md[#anchor]`` a comment or docstring cites."""
    found = []
    for top in _CITING_DIRS:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in _CITING_SUFFIXES or not path.is_file() or "__pycache__" in path.parts:
                continue
            if path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                for page, anchor in _CITATION.findall(line):
                    found.append((f"{path.relative_to(root)}:{number}", page, anchor))
    return found


def test_every_docs_citation_in_the_code_resolves():
    problems = []
    cache: dict[Path, set[str]] = {}
    for where, page, anchor in cited_docs():
        dest = ROOT / "docs" / page
        if not dest.exists():
            problems.append(f"{where}: docs/{page} does not exist")
        elif anchor:
            if dest not in cache:
                cache[dest] = anchors(dest)
            if anchor not in cache[dest]:
                problems.append(f"{where}: no heading '#{anchor}' in docs/{page}")
    assert problems == []


def test_the_code_cites_docs():
    assert len(cited_docs()) > 40
