"""A family's registration is all or nothing, and an interrupted load is retried.

A family that raises half-way through registering keeps nothing: not the rules it
registered (nor the rules they replaced stay replaced), its settings or its value
types. A `KeyboardInterrupt` while the families load takes back the family it hit
and leaves loading undone: the next call loads the families not loaded yet. The
families here are loaded in this process, from a package written to a temporary
directory or from an object (`quax.testing.assert_registration_all_or_nothing`).
"""

import importlib.metadata
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._journal
import quax.testing
from jax import lax
from quax._dispatch import _plugins
from quax.plugins import PluginWarning
from quax.testing import registry_state

from .helpers import Dense


class Celsius(quax.ArrayValue):
    """A unit-carrying array of the test's own: `exp` of it is the exp of its
    numbers (as for a dimensionless quantity)."""

    array: Any

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Any:
        raise RuntimeError("Refusing to materialise `Celsius`")


@quax.register(lax.exp_p)
def _exp(x: Celsius, **params: Any) -> Celsius:
    return Celsius(lax.exp_p.bind(x.array, **params))


def test_a_failed_family_keeps_no_rule() -> None:
    # The case: a rule registered before the failure still dispatched.
    x = Celsius(jnp.array([0.0, 1.0]))

    def register() -> None:
        @quax.register(lax.exp_p)
        def _(x: Celsius, **params: Any) -> Celsius:
            return Celsius(jnp.full(jnp.shape(x.array), -999.0))

        @quax.register(lax.log_p)
        def _(x: Celsius, **params: Any) -> Celsius:
            return x

        quax.plugins.add_setting(lambda: "faulty")

        class Kelvin(Celsius):
            pass

    quax.testing.assert_registration_all_or_nothing(register)
    out = quax.quaxify(jnp.exp)(x)
    np.testing.assert_allclose(out.array, [1.0, 2.718281828], rtol=1e-6)
    # `log` has no rule again: the refusal of the type's default.
    with pytest.raises(RuntimeError, match="Refusing to materialise `Celsius`"):
        quax.quaxify(jnp.log)(x)


def test_the_fault_check_finds_what_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the take-back turned off, the check names the rule that stayed.
    kept: list[Any] = []
    monkeypatch.setattr(
        quax._foundation._journal, "record", lambda undo, module: kept.append(undo)
    )

    def register() -> None:
        @quax.register(lax.sinh_p)
        def _(x: Celsius, **params: Any) -> Celsius:
            return x

    with pytest.raises(AssertionError, match="the rules for `sinh` changed"):
        quax.testing.assert_registration_all_or_nothing(register)
    for undo in reversed(kept):
        undo()


def test_a_failed_family_fails_once_with_its_name_and_error() -> None:
    class Faulty:
        @quax.hookspecs.hookimpl
        def quax_register_rules(self) -> None:
            raise ValueError("half-way")

    before = registry_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        family = _plugins.load_in_process("faulty_family", Faulty())
    assert family.state == "failed"
    assert family.error == "ValueError: half-way"
    (warning,) = caught
    assert warning.category is PluginWarning
    message = str(warning.message)
    assert "'faulty_family'" in message and "ValueError: half-way" in message
    assert "taken back" in message
    assert registry_state() == before


# A family package written to a temporary directory: its `_rules` module registers a
# rule for its value type; its hook raises `KeyboardInterrupt` after importing it
# while the file `interrupt` exists next to it.
_PACKAGE = {
    "__init__.py": "",
    "_value.py": """
        import jax, quax

        class Retried(quax.ArrayValue):
            array: jax.Array

            def aval(self):
                return jax.typeof(self.array)

            def materialise(self):
                raise RuntimeError("Refusing to materialise `Retried`")
    """,
    "_rules.py": """
        import quax
        from jax import lax
        from ._value import Retried

        @quax.register(lax.neg_p)
        def _(x: Retried, **params):
            return Retried(x.array * 10.0)
    """,
    "_plugin.py": """
        from pathlib import Path
        from quax.hookspecs import hookimpl

        @hookimpl
        def quax_register_rules():
            from . import _rules  # noqa: F401
            if (Path(__file__).parent / "interrupt").exists():
                raise KeyboardInterrupt
    """,
}

_LATER = {
    "__init__.py": "",
    "_plugin.py": """
        from quax.hookspecs import hookimpl

        loads = []

        @hookimpl
        def quax_register_rules():
            loads.append(1)
    """,
}


def _write(root: Path, name: str, files: dict[str, str]) -> None:
    package = root / name
    package.mkdir()
    for file, text in files.items():
        (package / file).write_text(textwrap.dedent(text))


def _family(name: str, package: str) -> _plugins.Family:
    entry_point = importlib.metadata.EntryPoint(
        name, f"{package}._plugin", _plugins.ENTRY_POINT_GROUP
    )
    return _plugins.Family(name, f"{package}-dist", "1.0", entry_point, package)


@pytest.fixture
def families(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Two installed families, `retried` then `later`, not loaded yet; autoload not
    run. Yields the `retried` package's directory."""
    _write(tmp_path, "quax_test_retried", _PACKAGE)
    _write(tmp_path, "quax_test_later", _LATER)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {
        "retried": _family("retried", "quax_test_retried"),
        "later": _family("later", "quax_test_later"),
    }
    monkeypatch.setattr(_plugins, "_families", found)
    monkeypatch.setattr(_plugins, "_autoloaded", False)
    monkeypatch.delenv(_plugins.DISABLE_ENV, raising=False)
    yield tmp_path / "quax_test_retried"
    for family in found.values():
        if family.plugin is not None:
            _plugins.manager().unregister(family.plugin)
    for module in list(sys.modules):
        if module.startswith(("quax_test_retried", "quax_test_later")):
            del sys.modules[module]


def test_an_interrupted_autoload_is_retried(families: Path) -> None:
    (families / "interrupt").touch()
    before = registry_state()
    with pytest.raises(KeyboardInterrupt):
        _plugins.autoload()
    # Nothing of the interrupted family is kept, and the next family never ran.
    assert registry_state() == before
    assert not any(m.startswith("quax_test_retried") for m in sys.modules)
    states = {f.name: f.state for f in _plugins.families()}
    assert states == {"retried": "available", "later": "available"}

    (families / "interrupt").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _plugins.autoload()
    states = {f.name: f.state for f in _plugins.families()}
    assert states == {"retried": "loaded", "later": "loaded"}
    assert sys.modules["quax_test_later._plugin"].loads == [1]
    # The retried family's rules module ran again: its rule dispatches.
    from quax_test_retried._value import Retried  # type: ignore[import-not-found]

    out = quax.quaxify(jnp.negative)(Retried(jnp.array([1.0, 2.0])))
    np.testing.assert_array_equal(out.array, [10.0, 20.0])
    # Loaded once: autoload is done.
    _plugins.autoload()
    assert sys.modules["quax_test_later._plugin"].loads == [1]


def test_a_rule_replaced_by_a_failed_family_comes_back() -> None:
    x = Dense(jnp.array([1.0, 2.0]))

    @quax.register(lax.cbrt_p)
    def original(x: Dense, **params: Any) -> Dense:
        return Dense(x.array + 100.0)

    def register() -> None:
        @quax.register(lax.cbrt_p)
        def replacing(x: Dense, **params: Any) -> Dense:
            return Dense(x.array - 100.0)

    quax.testing.assert_registration_all_or_nothing(register)
    np.testing.assert_array_equal(quax.quaxify(lax.cbrt)(x).array, [101.0, 102.0])
