"""The families use only the core's public API: `quax`, its public modules
(`quax.plugins`, `quax.testing`, `quax.extend` for what a family needs from JAX's
internals, ...), never a private `quax._` name, so that the core's inside can change
without breaking a family (first-party or third-party)."""

import ast
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
FAMILY_SOURCES = sorted(
    path
    for source in ROOT.glob("quax-*/src")
    if source.parent.name != "quax-core"
    for path in source.rglob("*.py")
)


def _private(name: str) -> bool:
    """Whether the dotted `name` reaches a private part of `quax`: a component after
    `quax` starting with one underscore (`quax.__version__` is public)."""
    parts = name.split(".")
    return parts[0] == "quax" and any(
        p.startswith("_") and not p.startswith("__") for p in parts[1:]
    )


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def private_uses(source: str) -> list[str]:
    """The private `quax._` names that Python `source` imports or reads."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [
                f"{node.module}.{a.name}"
                for a in node.names
                if _private(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name is not None and _private(name):
                found.append(name)
    return found


def test_the_check_finds_private_names():
    source = (
        "import quax._compat\n"
        "from quax._compat import release_traces\n"
        "from quax import _compat, extend\n"
        "import quax\n"
        "x = quax._dispatch._registry\n"
        "v = quax.__version__\n"
        "from quax.extend import pinv_function\n"
    )
    assert private_uses(source) == [
        "quax._compat",
        "quax._compat.release_traces",
        "quax._compat",
        "quax._dispatch._registry",
        "quax._dispatch",
    ]


def test_there_are_families_to_check():
    names = {p.relative_to(ROOT).parts[0] for p in FAMILY_SOURCES}
    assert {"quax-lora", "quax-units", "quax-structured", "quax-named"} <= names


@pytest.mark.parametrize("path", FAMILY_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_family_source_uses_no_private_core_name(path):
    used = private_uses(path.read_text())
    assert not used, (
        f"{path.relative_to(ROOT)} uses private core names {used}: use the public "
        "API, or `quax.extend` for what a family needs from JAX's internals (add "
        "the name there, documented, if it is missing)"
    )
