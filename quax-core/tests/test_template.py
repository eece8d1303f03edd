"""The family template and its scaffold (`templates/new_family.py`): a generated
family is lint-clean, is found by quax through its entry point, and its own tests
(built on `quax.testing`) pass; the workspace root gains it once."""

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest


# The family template, generated and tested in a subprocess: its subject is the
# template, not the caches; so they run in the normal mode only (scripts/test.sh), not
# in the cache verify mode run.
pytestmark = pytest.mark.normal_mode_only


REPO = Path(__file__).resolve().parents[2]
SCAFFOLD = REPO / "templates" / "new_family.py"

# The parts of the workspace root the scaffold edits, as the real one has them.
ROOT_PYPROJECT = """\
[project]
name = "quax-workspace"
version = "0"
dependencies = [
    "quax-core",
    "quax-lora",
]

[tool.uv.workspace]
members = [
    "quax-core",
    "quax-lora",
]

[tool.uv.sources]
quax-core = { workspace = true }
quax-lora = { workspace = true }

[tool.pyright]
include = [
    "quax-core/src",
    "quax-lora/src",
]
venvPath = "."
"""


def _load_scaffold():
    spec = importlib.util.spec_from_file_location("new_family", SCAFFOLD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["new_family"] = module
    spec.loader.exec_module(module)
    return module


def _scaffold(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(SCAFFOLD), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_names():
    names = _load_scaffold().Names.of("banded_matrix")
    assert (names.name, names.dist, names.package) == (
        "banded_matrix",
        "quax-banded-matrix",
        "quax_banded_matrix",
    )
    assert names.value == "BandedMatrixArray"
    assert names.error == "BandedMatrixMaterialisationError"
    with pytest.raises(ValueError, match=r"unknown template placeholder \{\{nme\}\}"):
        names.substitute("x = {{nme}}")


@pytest.mark.parametrize("bad", ["Banded", "2d", "with-dash", "class", ""])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError, match="lowercase Python identifier"):
        _load_scaffold().Names.of(bad)
    result = subprocess.run(
        [sys.executable, str(SCAFFOLD), bad, "--dest", "unused"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "lowercase Python identifier" in result.stderr


def test_generate_into_a_workspace(tmp_path):
    (tmp_path / "pyproject.toml").write_text(ROOT_PYPROJECT)
    out = _scaffold("banded_matrix", "--dest", str(tmp_path))
    assert "14 file(s) written" in out
    family = tmp_path / "quax-banded-matrix"
    files = sorted(str(p.relative_to(family)) for p in family.rglob("*") if p.is_file())
    assert files == [
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "src/quax_banded_matrix/__init__.py",
        "src/quax_banded_matrix/_kernels.py",
        "src/quax_banded_matrix/_model.py",
        "src/quax_banded_matrix/_nnx.py",
        "src/quax_banded_matrix/_plugin.py",
        "src/quax_banded_matrix/_rules.py",
        "src/quax_banded_matrix/_value.py",
        "src/quax_banded_matrix/py.typed",
        "tests/test_banded_matrix.py",
        "tests/test_model.py",
        "tests/test_structure.py",
    ]
    for path in family.rglob("*"):
        if path.is_file():
            assert "{{" not in path.read_text(), path

    # The family's own pyproject: entry point and core range.
    project = tomllib.loads((family / "pyproject.toml").read_text())["project"]
    assert project["name"] == "quax-banded-matrix"
    assert project["entry-points"]["quax.rules"] == {
        "banded_matrix": "quax_banded_matrix._plugin"
    }
    assert project["dependencies"] == ["quax-core>=0.5.0,<0.6"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert (family / "LICENSE").read_text() == (REPO / "LICENSE").read_text()
    readme = (family / "README.md").read_text()
    for section in ("Install", "Usage", "What it covers", "Benchmark", "Limits"):
        assert f"\n## {section}\n" in readme

    # The workspace root gains the family in its four places.
    root = tomllib.loads((tmp_path / "pyproject.toml").read_text())
    assert root["project"]["dependencies"][-1] == "quax-banded-matrix"
    assert root["tool"]["uv"]["workspace"]["members"][-1] == "quax-banded-matrix"
    assert root["tool"]["uv"]["sources"]["quax-banded-matrix"] == {"workspace": True}
    assert root["tool"]["pyright"]["include"][-2:] == [
        "quax-banded-matrix/src",
        "quax-banded-matrix/tests",
    ]
    assert root["tool"]["pyright"]["venvPath"] == "."

    # Idempotent: a second run writes nothing and adds nothing.
    before = (tmp_path / "pyproject.toml").read_text()
    readme_path = family / "README.md"
    readme_path.write_text(readme + "\nEdited by the author.\n")
    out = _scaffold("banded_matrix", "--dest", str(tmp_path))
    assert "0 file(s) written (all kept)" in out
    assert "nothing to add" in out
    assert (tmp_path / "pyproject.toml").read_text() == before
    assert readme_path.read_text().endswith("Edited by the author.\n")


def test_generate_without_a_workspace(tmp_path):
    out = _scaffold("demo", "--dest", str(tmp_path))
    assert "add quax-demo to your workspace by hand" in out
    assert (tmp_path / "quax-demo" / "src" / "quax_demo" / "_plugin.py").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff, a development tool, is not installed here (as on the accelerator "
    "machine, which runs the suites from wheels); CI runs this check",
)
def test_generated_family_lints(tmp_path):
    _scaffold("banded_matrix", "--dest", str(tmp_path))
    family = tmp_path / "quax-banded-matrix"
    config = str(REPO / "pyproject.toml")  # the repository's ruff settings
    for command in (["check", "-q", "--no-cache"], ["format", "--check", "-q"]):
        lint = subprocess.run(
            [sys.executable, "-m", "ruff", *command, "--config", config, str(family)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_generated_family_passes_its_tests(tmp_path):
    _scaffold("banded_matrix", "--dest", str(tmp_path))
    family = tmp_path / "quax-banded-matrix"
    # As installed: the distribution's metadata with its entry point, beside the
    # source, so that quax discovers it as it would after `pip install`.
    src = family / "src"
    info = src / "quax_banded_matrix-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: quax-banded-matrix\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[quax.rules]\nbanded_matrix = quax_banded_matrix._plugin\n"
    )
    # Its HLO check reads the HLO users' programs compile to: without the root
    # conftest.py (which compiles the HLO checks' programs so), XLA's fusion emitters
    # stay on (scripts/test.sh turns them off for speed).
    flags = os.environ.get("XLA_FLAGS", "").split()
    xla_flags = " ".join(f for f in flags if f != "--xla_cpu_use_fusion_emitters=false")
    # The family's source before what this process sees (where an accelerator
    # machine's `PYTHONPATH` holds its JAX and the wheels under test).
    path = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags)
    # A Cloud TPU machine's JAX warns at import that transparent hugepages are off: a
    # setting of that machine, not of the family under test.
    hugepages = "ignore:Transparent hugepages are not enabled:UserWarning"
    options = ["-q", "-p", "no:cacheprovider", "-W", "error", "-W", hugepages]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(family)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # Every role's test ran: the NNX one only where Flax is installed (an optional
    # dependency of the generated family, as of quax-lora and quax-quant).
    if importlib.util.find_spec("flax") is None:
        assert "10 passed, 1 skipped" in result.stdout
    else:
        assert "11 passed" in result.stdout and "skipped" not in result.stdout
