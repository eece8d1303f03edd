"""The docs cannot drift: every Python code block of the documentation pages and the
READMEs runs, in order, one namespace per file (sybil).

A block that cannot run as it stands (a shell command, a partial snippet) uses another
fence (`bash`, `console`, `toml`, `text`), or is preceded by sybil's skip directive
with a reason: `<!-- skip: next "needs a GPU" -->`.
"""

import importlib.util
import json
import os
import pathlib
import re
import sys
import types
import unicodedata
import unittest

import jax
import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser


# The documentation's code blocks, run as a reader runs them, with users' settings:
# their subject is the pages, not the caches; so they run in the normal mode only
# (scripts/test.sh), not in the cache verify mode run.
pytestmark = pytest.mark.normal_mode_only


ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md"))
READMES = [ROOT / "README.md", *sorted(ROOT.glob("quax-*/README.md"))]
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
        try:
            example.evaluate()
        except unittest.SkipTest:
            # A block after `<!-- skip: next "reason" -->`; the page goes on.
            continue


def _load(relative: str, name: str):
    """The repository's script `relative` (not a package's module), imported as
    `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _runner():
    return _load("benchmarks/run.py", "quax_benchmarks_run")


def test_benchmark_runner(tmp_path, capsys):
    # `benchmarks/run.py` (documented in docs/benchmarks.md) on two tiny benchmarks:
    # one that follows the contract, one that fails; the real ones are too slow here.
    (tmp_path / "tiny.py").write_text(
        "def main(quick=False):\n"
        "    return {'quick': quick, 'trace_ratio': 1.5,\n"
        "            'rows': [{'n': 8, 'quax/hand': 0.5, 'seconds': 2.0}]}\n"
    )
    (tmp_path / "broken.py").write_text("def main(quick=False):\n    1 / 0\n")
    out = tmp_path / "figures.json"
    results = _runner().run(
        quick=True, json_path=out, directory=tmp_path, images=tmp_path / "images"
    )
    written = json.loads(out.read_text())
    assert written == results
    assert written["mode"] == "quick"
    assert written["benchmarks"]["tiny"]["figures"]["quick"] is True
    assert "ZeroDivisionError" in written["benchmarks"]["broken"]["error"]
    assert "jax" in written["environment"]["versions"]
    table = capsys.readouterr().out
    assert "| tiny | trace_ratio | 1.5 |" in table
    assert "| tiny | rows[8].quax/hand | 0.5 |" in table
    assert "seconds" not in table.split("Ratios measured")[1].split("Plots")[0]
    assert "| broken | failed | ZeroDivisionError" in table


def test_benchmark_runner_refuses_unknown_names(tmp_path):
    with pytest.raises(SystemExit, match=r"unknown benchmark.*nope"):
        _runner().run(["nope"], directory=tmp_path)


def _stamped_venv(root: pathlib.Path, requirements: pathlib.Path, text: str):
    """A stand-in for the published quax's environment, built from `text`."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / requirements.name).write_text(text)
    return root


def test_published_environment_reused_or_explained(tmp_path):
    runner = _runner()
    requirements = tmp_path / "published-requirements.txt"
    requirements.write_text("quax==0.4.6\n")
    missing = tmp_path / "missing"
    python, why = runner.published_python(
        build=False, venv=missing, requirements=requirements
    )
    assert python is None
    assert "is missing" in why and "--published" in why and "PyPI" in why
    venv = _stamped_venv(tmp_path / "venv", requirements, "quax==0.4.6\n")
    python, how = runner.published_python(
        build=False, venv=venv, requirements=requirements
    )
    assert python == str(venv / "bin" / "python")
    assert how.startswith("reused")
    requirements.write_text("quax==0.4.6\njax==0.10.2\n")
    python, why = runner.published_python(
        build=False, venv=venv, requirements=requirements
    )
    assert python is None and "is out of date" in why


def test_benchmark_runner_passes_the_published_python(tmp_path, capsys, monkeypatch):
    # A benchmark named `published` sees the environment's interpreter as
    # QUAX_PUBLISHED_PYTHON; quick mode without that environment says why and
    # does not build it (no network).
    monkeypatch.delenv("QUAX_PUBLISHED_PYTHON", raising=False)
    (tmp_path / "published.py").write_text(
        "import os\n"
        "def main(quick=False):\n"
        "    return {'python': os.environ.get('QUAX_PUBLISHED_PYTHON')}\n"
    )
    runner = _runner()
    missing = tmp_path / "missing"
    results = runner.run(
        quick=True,
        json_path=tmp_path / "a.json",
        directory=tmp_path,
        images=tmp_path,
        published_venv=missing,
    )
    assert not missing.exists()
    assert results["published"]["python"] is None
    assert results["benchmarks"]["published"]["figures"] == {"python": None}
    out = capsys.readouterr().out
    assert "published quax not measured: the published quax's environment" in out
    assert "| published quax | not measured |" in out

    venv = _stamped_venv(
        tmp_path / "venv",
        runner.PUBLISHED_REQUIREMENTS,
        runner.PUBLISHED_REQUIREMENTS.read_text(),
    )
    results = runner.run(
        quick=True,
        json_path=tmp_path / "b.json",
        directory=tmp_path,
        images=tmp_path,
        published_venv=venv,
    )
    python = str(venv / "bin" / "python")
    assert results["published"] == {"python": python, "how": f"reused {venv}"}
    assert results["benchmarks"]["published"]["figures"] == {"python": python}
    assert "QUAX_PUBLISHED_PYTHON" not in os.environ
    results = runner.run(
        quick=False,
        json_path=tmp_path / "c.json",
        directory=tmp_path,
        images=tmp_path,
        published=False,
    )
    assert results["published"] == {
        "python": None,
        "how": "left out (--no-published)",
    }


def test_published_side_by_side_ratios():
    published = _load("benchmarks/published.py", "quax_benchmark_published")
    ours = {"workloads": {"w": {"quax_ms": 1.0, "plain_ms": 2.0, "quax/plain": 0.5}}}
    theirs = {
        "workloads": {
            "w": {
                "quax_ms": 8.0,
                "plain_ms": 4.0,
                "quax/plain": 2.0,
                "refused": "Refusing to materialise sparse matrix",
            }
        }
    }
    row = published.side_by_side(ours, theirs)["w"]
    assert row["ours/published"] == 0.25
    assert row["published_ms"] == 8.0 and row["published/plain"] == 2.0
    assert row["published refused"] == "Refusing to materialise sparse matrix"
    alone = published.side_by_side(ours, None)["w"]
    assert alone == {"ours_ms": 1.0, "plain_ms": 2.0, "ours/plain": 0.5}


def _example(name: str):
    return _load(f"examples/{name}.py", f"quax_example_{name}")


def test_tour_skips_a_family_not_installed(tmp_path, capsys, monkeypatch):
    tour = _example("tour")
    missing = tour.Stop("A family not installed", "nothing", ("quax_not_installed",))
    monkeypatch.setattr(tour, "DISTRIBUTIONS", {"quax_not_installed": "quax-absent"})
    monkeypatch.setattr(tour, "STOPS", (missing,))
    results = tour.main(out_dir=str(tmp_path / "out"))
    assert results["A family not installed"] == {
        "status": "skipped: pip install quax-absent"
    }
    core = results["The core: symbolic zeros and the installed families"]
    assert core["Zero * x + x"] == "[0.0, 1.0, 2.0]"
    out = capsys.readouterr().out
    assert "| A family not installed | - | status: skipped" in out
    assert f"Plots written to {tmp_path / 'out'}" in out


def test_every_example_is_a_stop_of_the_tour_and_listed():
    # A new example joins the tour (`STOPS`) and the getting-started page's table.
    examples = {p.stem for p in (ROOT / "examples").glob("*.py")} - {"tour"}
    assert {stop.example for stop in _example("tour").STOPS} == examples
    guide = (ROOT / "docs" / "getting-started.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", guide, re.MULTILINE))
    assert listed == examples


def test_units_oscillator_example(tmp_path):
    # JAX's tracer-leak checker crashes inside diffrax (an IndexError in its
    # `leaked_tracer_error`), with or without quax: off for this program, as in
    # tests/test_real_programs.py.
    with jax.check_tracer_leaks(False):
        figures = _example("units_oscillator").main(out_dir=str(tmp_path))
    assert float(figures["max |x - closed form|"].removesuffix(" cm")) < 1e-3
    assert figures["unit mistakes"] == "refused at trace time (UnitError)"
    assert (tmp_path / "units_oscillator.png").stat().st_size > 0


# The families' READMEs are for users (install, a first example, what it covers,
# limits); the depth is on the documentation site's page of each family, which
# opens with the README (scripts/mkdocs_hooks.py includes it) and holds the rest.
FAMILY_READMES = [p for p in READMES if p.parent.name.startswith("quax-")]
FAMILY_READMES = [p for p in FAMILY_READMES if p.parent.name != "quax-core"]
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _page_of(readme: pathlib.Path) -> pathlib.Path:
    return ROOT / "docs" / "families" / f"{readme.parent.name.removeprefix('quax-')}.md"


def _anchors(*texts: str) -> list[str]:
    """The heading anchors mkdocs gives these Markdown texts, in order (as
    Python-Markdown's `toc` slugifies a heading's text, its code marks dropped)."""
    anchors = []
    for text in texts:
        text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        for heading in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE):
            plain = unicodedata.normalize("NFKD", heading.replace("`", ""))
            plain = plain.encode("ascii", "ignore").decode("ascii")
            plain = re.sub(r"[^\w\s-]", "", plain).strip().lower()
            anchors.append(re.sub(r"[-\s]+", "-", plain))
    return anchors


def test_family_readmes_lead_with_what_users_need():
    assert len(FAMILY_READMES) == 6, FAMILY_READMES
    for readme in FAMILY_READMES:
        text = readme.read_text()
        lines = text.count("\n")
        assert lines <= 300, f"{readme.parent.name}'s README has {lines} lines"
        headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
        order = [h for h in headings if h in ("Install", "Usage", "What it covers")]
        assert order == ["Install", "Usage", "What it covers"], (readme, headings)
        assert any(h.startswith("Limits") for h in headings), readme
        assert headings.index("Install") < 2, (readme, headings)  # near the top
        assert f"../docs/families/{_page_of(readme).name}" in text, readme


@pytest.mark.parametrize("readme", FAMILY_READMES, ids=lambda p: p.parent.name)
def test_family_page_holds_the_depth(readme):
    page = _page_of(readme)
    text = page.read_text()
    marker = f"<!-- readme: {readme.relative_to(ROOT)} -->"
    assert text.count(marker) == 1, f"{page.name} does not open with its README"
    own = text.split(marker)[1]
    # A real page, not a stub that points back to the README.
    assert own.count("\n") >= 100, f"{page.name} holds {own.count(chr(10))} lines"
    # The README, as the page includes it (its title dropped), then the page's own
    # sections: no anchor twice, and every link into the page reaches a heading.
    readme_text = readme.read_text().split("\n", 1)[1]
    anchors = _anchors(text.split(marker)[0], readme_text, own)
    assert len(anchors) == len(set(anchors)), sorted(
        a for a in anchors if anchors.count(a) > 1
    )
    for source, prefix in ((readme_text, f"../docs/families/{page.name}"), (own, "")):
        for target in _LINK.findall(source):
            path, _, anchor = target.partition("#")
            if anchor and path in (prefix, ""):
                assert anchor in anchors, f"{target} in {page.name}'s family"


def test_docs_hook_includes_the_readme(tmp_path, monkeypatch):
    hooks = _load("scripts/mkdocs_hooks.py", "quax_mkdocs_hooks")
    (tmp_path / "quax-demo").mkdir()
    (tmp_path / "quax-demo" / "README.md").write_text(
        "# quax-demo\n\nSee [the core](../README.md), [errors](../docs/errors.md),\n"
        "[the guide](../docs/families/demo.md#guide), [a plot]"
        "(../docs/images/demo.png) and [the example](../examples/demo.py).\n"
        "<!-- readme-only -->\nThe full guide is on the documentation page.\n"
        "<!-- /readme-only -->\nLast line.\n"
    )
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="families/demo.md"))
    out = hooks.on_page_markdown(
        "# Demo\n\n<!-- readme: quax-demo/README.md -->\n\n## Guide\n", page, None, None
    )
    assert out == (
        "# Demo\n\n\nSee [the core](../index.md), [errors](../errors.md),\n"
        "[the guide](#guide), [a plot](../images/demo.png) and the example "
        "(`examples/demo.py`).\nLast line.\n\n\n## Guide\n"
    )
