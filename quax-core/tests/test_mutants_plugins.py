"""Tests written for mutants of `quax/_dispatch/_plugins.py` that a sampled run of
`scripts/mutation.sh dispatch-plugins` let through or reached with no test (see
`docs/mutation.md`), each failing with its mutant planted. They run in this process
(the loader's other tests run Python in subprocesses, which mutmut does not see),
with the installed families replaced by what each test names."""

import importlib.metadata
import types
from collections.abc import Iterator
from typing import Any

import pytest
import quax
from quax._dispatch import _plugins


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The installed families, as discovery finds them: empty until a test adds
    one; the families loaded in the process are unregistered afterwards."""
    families: dict[str, Any] = {}
    monkeypatch.setattr(_plugins, "_discover", lambda: families)
    yield families
    for name in families:
        if _plugins.manager().has_plugin(name):
            _plugins.manager().unregister(name=name)


def test_loading_a_family_when_none_is_installed_says_none(
    installed: dict[str, Any],
) -> None:
    """(mutant `load` 9 changed the word.)"""
    del installed
    with pytest.raises(LookupError) as error:
        quax.plugins.load("lora")
    assert str(error.value) == (
        "No quax family named 'lora' is installed (installed: none)."
    )


def test_an_example_module_names_the_distribution_to_install(
    installed: dict[str, Any],
) -> None:
    """A known family that is not installed: its distribution is named (mutant
    `example_module` 39 looked up no name)."""
    del installed
    with pytest.raises(ImportError, match=r"install the distribution `quax-units`"):
        _plugins.example_module("unitful")
    with pytest.raises(ImportError, match=r"declares it in the `quax.rules`"):
        _plugins.example_module("nonesuch")


def test_an_example_module_of_a_failed_family_says_it_failed(
    installed: dict[str, Any],
) -> None:
    """(mutant `example_module` 34 said so for every other family instead.)"""

    class Failing:
        @quax.hookspecs.hookimpl
        def quax_register_rules(self) -> None:
            raise RuntimeError("no rules today")

    with pytest.warns(_plugins.PluginWarning):
        family = _plugins.load_in_process("failing_family", Failing())
    assert family.state == "failed"
    installed["failing_family"] = family
    with pytest.raises(ImportError, match="installed but failed to load: "):
        _plugins.example_module("failing_family")


def test_an_example_module_is_the_one_the_family_gives(
    installed: dict[str, Any],
) -> None:
    """A loaded family's `quax_example_module` hook answers `quax.examples.<name>`
    (mutant `example_module` 23 called no hook)."""
    module = types.ModuleType("examples_of_a_family")

    class Giving:
        @quax.hookspecs.hookimpl
        def quax_example_module(self) -> types.ModuleType:
            return module

    family = _plugins.load_in_process("giving_family", Giving())
    assert family.state == "loaded"
    installed["giving_family"] = family
    assert _plugins.example_module("giving_family") is module


def test_import_loads_the_builtin_families_that_are_available(
    installed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_builtins` (run by `import quax`) loads the families that ship inside
    quax-core and are not loaded yet, and no other (mutant `load_builtins` 2 loaded
    every other one instead)."""
    loaded: list[str] = []
    monkeypatch.setattr(
        _plugins, "_load_one", lambda family: loaded.append(family.name)
    )
    point = lambda name: importlib.metadata.EntryPoint(name, "m", "quax.rules")
    for name, state, builtin in [
        ("builtin_available", "available", True),
        ("builtin_loaded", "loaded", True),
        ("builtin_blocked", "blocked", True),
        ("installed_available", "available", False),
    ]:
        installed[name] = _plugins.Family(
            name, "d", "0", point(name), package="p", state=state, builtin=builtin
        )
    _plugins.load_builtins()
    assert loaded == ["builtin_available"]
