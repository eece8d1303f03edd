"""Tests written for mutants of `quax/_dispatch/_plugins.py` that a sampled run of
`scripts/mutation.sh dispatch-plugins` let through or reached with no test (see
`docs/mutation.md`), each failing with its mutant planted. They run in this process
(the loader's other tests run Python in subprocesses, which mutmut does not see),
with the installed families replaced by what each test names, but for the test of
discovery, which reads the families the workspace installs."""

import importlib
import importlib.metadata
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
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


@pytest.mark.parametrize(
    ("names", "listed"), [((), "none"), (("beta", "alpha"), "alpha, beta")]
)
def test_loading_an_unknown_family_lists_the_installed_ones(
    installed: dict[str, Any], names: tuple[str, ...], listed: str
) -> None:
    """The installed families by name, or "none" (mutants `load` 9 and 7 changed
    the word and the separator)."""
    for name in names:
        point = importlib.metadata.EntryPoint(name, "m", "quax.rules")
        installed[name] = _plugins.Family(name, "d", "0", point, package="p")
    with pytest.raises(LookupError) as error:
        quax.plugins.load("gamma")
    assert str(error.value) == (
        f"No quax family named 'gamma' is installed (installed: {listed})."
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


def test_the_families_inside_quax_core_are_builtin() -> None:
    """The families quax-core ships (`zero`) are discovered as built in, which is
    what `load_builtins` loads at import; the installed ones are not (mutant
    `_discover` 32 said no family was built in)."""
    found = {f.name: f for f in quax.plugins.families()}
    assert set(_plugins.BUILTIN_FAMILIES) <= set(found)
    for name, family in found.items():
        assert family.builtin == (name in _plugins.BUILTIN_FAMILIES), name
        assert family.builtin == (family.distribution == "quax-core"), name


def test_an_example_module_by_an_alias_of_the_family(
    installed: dict[str, Any],
) -> None:
    """A family's `quax_example_aliases` name its example module too (mutants
    `_aliases` 8 and `example_module` 20 asked no family for them)."""
    module = types.ModuleType("examples_by_alias")

    class Aliased:
        @quax.hookspecs.hookimpl
        def quax_example_module(self) -> types.ModuleType:
            return module

        @quax.hookspecs.hookimpl
        def quax_example_aliases(self) -> list[str]:
            return ["also_known_as"]

    family = _plugins.load_in_process("aliased_family", Aliased())
    installed["aliased_family"] = family
    assert _plugins.example_module("also_known_as") is module


def test_an_installed_family_names_the_distribution_that_declares_it() -> None:
    """An installed family's `distribution` and `version` are those of the
    distribution whose entry point declares it, as `importlib.metadata` reads them
    (`quax-lora` for `lora`), never "?" (mutant `_discover` 53 gave "?" for a
    known distribution)."""
    points = importlib.metadata.entry_points(group="quax.rules")
    assert points  # the workspace installs the families
    found = {f.name: f for f in quax.plugins.families()}
    for point in points:
        assert point.dist is not None
        family = found[point.name]
        assert family.distribution == point.dist.name == f"quax-{point.name}"
        assert family.version == point.dist.version


def test_a_loaded_family_declares_its_value_types(installed: dict[str, Any]) -> None:
    """A loaded family's value types are those its `quax_value_types` hook gives;
    a family not loaded declares none (mutant `value_types` 7 asked no hook: a
    `TypeError`)."""

    class Declared(quax.ArrayValue):
        pass

    class Declaring:
        @quax.hookspecs.hookimpl
        def quax_value_types(self) -> list[type[quax.Value]]:
            return [Declared]

    family = _plugins.load_in_process("declaring_family", Declaring())
    installed["declaring_family"] = family
    assert _plugins.value_types(family) == [Declared]
    point = importlib.metadata.EntryPoint("idle_family", "m", "quax.rules")
    idle = _plugins.Family("idle_family", "d", "0", point, package="p")
    assert _plugins.value_types(idle) == []


def test_an_installed_family_owns_the_package_of_its_entry_point() -> None:
    """An installed family's package is the top-level package of the module its
    entry point names (`quax_lora` for `lora`), and the family owns that package's
    modules: a failed load forgets them (mutant `_discover` 43 recorded no
    package)."""
    points = importlib.metadata.entry_points(group="quax.rules")
    assert points  # the workspace installs the families
    found = {f.name: f for f in quax.plugins.families()}
    for point in points:
        family = found[point.name]
        assert family.package == f"quax_{point.name}"
        assert family.owns(f"quax_{point.name}._rules")
        assert not family.owns(f"quax_{point.name}x")


@pytest.mark.parametrize(
    "module", ["quax_planted_helper.values", "quax_planted_deep.sub.values"]
)
def test_a_failed_load_forgets_the_modules_of_a_package_it_added_from(
    module: str,
    installed: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A family whose registration imports another package's module, which adds to
    quax's tables (a value type), and then fails: that package's modules are
    forgotten with the family's, every level of them, so that importing them again
    adds again (mutant `_forget_new_modules` 18 compared whole module names with
    the packages, and forgot only the package's top module; mutant 9 took the
    module's parent for its package, `quax_planted_deep.sub` for the module two
    levels down, which no module's top-level name equals: nothing was forgotten)."""
    parts = module.split(".")
    folder = tmp_path.joinpath(*parts[:-1])
    folder.mkdir(parents=True)
    for level in range(1, len(parts)):
        (tmp_path.joinpath(*parts[:level]) / "__init__.py").write_text("")
    (folder / f"{parts[-1]}.py").write_text(
        "import quax\n\n\nclass Planted(quax.ArrayValue):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    class HalfWay:
        @quax.hookspecs.hookimpl
        def quax_register_rules(self) -> None:
            importlib.import_module(module)
            raise RuntimeError("failed half-way")

    with pytest.warns(_plugins.PluginWarning):
        family = _plugins.load_in_process("half_way_family", HalfWay())
    installed["half_way_family"] = family
    assert family.state == "failed"
    for level in range(1, len(parts) + 1):
        assert ".".join(parts[:level]) not in sys.modules


def test_autoload_loads_the_families_on_its_first_call_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`autoload`, which every quaxified call makes, loads the installed families
    once; afterwards it returns at once (mutant `autoload` 12 never marked the
    loading done, and every call loaded again)."""
    loads: list[str | None] = []
    monkeypatch.setattr(_plugins, "_autoloaded", False)
    monkeypatch.setattr(_plugins, "load", lambda name=None: loads.append(name) or [])
    monkeypatch.delenv(_plugins.DISABLE_ENV, raising=False)
    for _ in range(3):
        _plugins.autoload()
    assert loads == [None]


def test_an_example_module_not_available_is_an_import_error_naming_it(
    installed: dict[str, Any],
) -> None:
    """The `ImportError` of an example module that is not available names the
    module, as Python's own do (mutant `example_module` 48 named none)."""
    del installed
    with pytest.raises(ImportError) as error:
        _plugins.example_module("nonesuch")
    assert error.value.name == "quax.examples.nonesuch"


def test_an_installed_family_not_loaded_yet_is_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Discovered afresh, with no family loaded, each installed family is
    `"available"`, the state `load` loads (mutant `_discover` 68 wrote
    `"AVAILABLE"`, which `load` skips: no installed family was ever loaded)."""
    points = importlib.metadata.entry_points(group="quax.rules")
    assert points  # the workspace installs the families
    monkeypatch.setattr(_plugins, "_families", None)
    monkeypatch.setattr(_plugins, "_blocked", set())
    monkeypatch.setattr(_plugins, "_manager", pluggy.PluginManager("quax_no_family"))
    found = _plugins._discover()
    for point in points:
        assert found[point.name].state == "available", point.name
    loaded: list[str] = []
    monkeypatch.setattr(
        _plugins, "_load_one", lambda family: loaded.append(family.name)
    )
    quax.plugins.load()
    assert set(loaded) >= {point.name for point in points}


@pytest.mark.parametrize(("value", "loads"), [("0", [None]), ("1", [])])
def test_autoload_is_disabled_by_any_value_but_0(
    monkeypatch: pytest.MonkeyPatch, value: str, loads: list[str | None]
) -> None:
    """`QUAX_DISABLE_PLUGIN_AUTOLOAD=0` leaves autoloading on, as unset does; `1`
    turns it off (mutant `autoload` 11 took `0` for off)."""
    seen: list[str | None] = []
    monkeypatch.setattr(_plugins, "_autoloaded", False)
    monkeypatch.setattr(_plugins, "load", lambda name=None: seen.append(name) or [])
    monkeypatch.setenv(_plugins.DISABLE_ENV, value)
    _plugins.autoload()
    assert seen == loads


def test_a_family_adding_to_the_trace_context_is_warned_of_with_the_way_out(
    installed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A family whose load adds to JAX's trace context is warned of, with what
    happens and the way out, word for word (mutant `_load_one` 70 changed the
    text). The trace context's size is the test's own counter."""
    size = [3]
    monkeypatch.setattr(_plugins, "trace_context_size", lambda: size[0])

    class Adding:
        @quax.hookspecs.hookimpl
        def quax_register_rules(self) -> None:
            size[0] += 1

    with pytest.warns(_plugins.PluginWarning) as record:
        family = _plugins.load_in_process("adding_family", Adding())
    installed["adding_family"] = family
    assert family.state == "loaded"
    assert [str(w.message) for w in record] == [
        "The quax family 'adding_family' (distribution <in process> 0) added 1 "
        "value to JAX's trace context as it loaded (a `jax.make_user_context`, or "
        "a JAX option included in the trace context, made at import): a `jax.jit` "
        "whose first call loads the families (the program's first quaxified call) "
        "then finds its cache key changed, and traces and compiles again on its "
        "next call. Make such a setting with `quax.plugins.jit_context(default)`, "
        "which adds nothing to JAX's trace context."
    ]


def test_a_family_loaded_in_process_names_no_distribution_but_that(
    installed: dict[str, Any],
) -> None:
    """A family loaded in the process is of the distribution `"<in process>"`,
    which its failure's warning names (mutant `load_in_process` 12 gave `None`)."""

    class Failing:
        @quax.hookspecs.hookimpl
        def quax_register_rules(self) -> None:
            raise RuntimeError("no rules today")

    with pytest.warns(
        _plugins.PluginWarning,
        match=r"^The quax family 'named_failing' \(distribution <in process> 0\) "
        "failed to load",
    ):
        family = _plugins.load_in_process("named_failing", Failing())
    installed["named_failing"] = family
    assert (family.distribution, family.version) == ("<in process>", "0")
