"""The docs cannot drift: every Python code block of the documentation pages and the
READMEs runs, in order, one namespace per file (sybil).

A block that cannot run as it stands (a shell command, a partial snippet) uses another
fence (`bash`, `console`, `toml`, `text`), or is preceded by sybil's skip directive
with a reason: `<!-- skip: next "needs a GPU" -->`.
"""

import pathlib

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser


ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md"))
READMES = [ROOT / "README.md", ROOT / "quax-core" / "README.md"]
PAGES = DOCS + READMES

_sybil = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


def test_pages_hold_code():
    # The glob found the documentation: an empty list would test nothing.
    assert len(DOCS) >= 10
    blocks = sum(len(list(_sybil.parse(p))) for p in DOCS)
    assert blocks >= 8, blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: pathlib.Path, monkeypatch, tmp_path):
    # Blocks that write files write them in a temporary folder.
    monkeypatch.chdir(tmp_path)
    document = _sybil.parse(page)
    for example in document:
        example.evaluate()
