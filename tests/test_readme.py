"""The Python examples of the README and of docs/ run as written (from the repository root, as a user
would), and the documentation's links between pages point at pages that exist."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page.relative_to(ROOT)), "exec"), namespace)


def test_the_readme_has_a_python_example():
    assert "```python" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_between_pages_resolve(page):
    for target in re.findall(r"\]\(([^)#:]+\.(?:md|png))(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"
