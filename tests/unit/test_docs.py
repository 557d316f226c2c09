"""The docs in `docs/` are self-contained and their Python examples run as written.

Every ```python block of every `docs/*.md` is a complete program, run in a subprocess
in a folder of its own (a fragment is fenced `py` instead). No page links or refers
outside the repository, and every relative link resolves to a file (and heading) in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

#: Things that point outside the repository (or at files it does not ship).
FORBIDDEN = ("../", "DESIGN.md", "shared/")
#: Variables that would make an example talk to something other than itself.
SCRUBBED_ENV = ("TETHER_DB", "TETHER_TOOLS", "TETHER_FAILPOINTS", "TETHER_MODEL")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)


def examples() -> list[tuple[Path, int, str]]:
    return [(page, n, block) for page in PAGES for n, block in enumerate(python_blocks(page))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a page."""
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_docs_exist() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "architecture.md", "writing-tools.md", "writing-judges.md"} <= names
    assert "operations.md" in names
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"


def test_the_docs_have_runnable_examples() -> None:
    for name in ("writing-tools.md", "writing-judges.md", "operations.md"):
        assert python_blocks(DOCS / name), f"{name} has no runnable Python example"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_reference_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for bad in FORBIDDEN:
        assert bad not in text, f"{page.name} refers to {bad!r}"
    for target in LINK.findall(text):
        assert "://" not in target and not target.startswith(("mailto:", "/")), (
            f"{page.name} links outside the repository: {target}"
        )
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        assert dest.resolve().is_relative_to(ROOT), f"{page.name}: {target} leaves the repo"
        assert dest.is_file(), f"{page.name} links to a missing file: {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name} links to a missing heading: {target}"


@pytest.mark.parametrize(
    ("page", "n", "block"),
    examples(),
    ids=[f"{page.name}-{n}" for page, n, _ in examples()],
)
def test_python_example_runs(page: Path, n: int, block: str, tmp_path: Path) -> None:
    script = tmp_path / f"{page.stem}_{n}.py"
    script.write_text(block, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, f"{page.name} example {n} failed:\n{res.stdout}\n{res.stderr}"
