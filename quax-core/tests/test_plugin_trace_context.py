"""A family that grows JAX's trace context as it loads (a `jax.make_user_context`
made at import, not through `quax.plugins.jit_context`) is reported with a
`PluginWarning` naming it and the way out: a `jax.jit` whose first call loaded it
would trace and compile again on its next call. The families are packages written
to a temporary directory, declared as installed, and loaded automatically."""

import importlib.metadata
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from quax._dispatch import _plugins
from quax.plugins import PluginWarning


_GROWING = """
    import jax
    from quax.hookspecs import hookimpl

    # Made at import: one more value in JAX's trace context.
    route = jax.make_user_context(default_value="plain")

    @hookimpl
    def quax_register_rules():
        pass
"""

_WELL_BEHAVED = """
    import quax
    from quax.hookspecs import hookimpl

    route = quax.plugins.jit_context("plain")

    @hookimpl
    def quax_register_rules():
        pass
"""


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Declare a family (its `_plugin` module's text) installed, as the only one
    not loaded yet, with autoload not run."""
    installed: dict[str, _plugins.Family] = {}
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_plugins, "_families", installed)
    monkeypatch.setattr(_plugins, "_autoloaded", False)
    monkeypatch.delenv(_plugins.DISABLE_ENV, raising=False)

    def add(name: str, plugin: str) -> None:
        package = f"quax_test_{name}"
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "_plugin.py").write_text(textwrap.dedent(plugin))
        entry_point = importlib.metadata.EntryPoint(
            name, f"{package}._plugin", _plugins.ENTRY_POINT_GROUP
        )
        installed[name] = _plugins.Family(
            name, f"{package}-dist", "1.0", entry_point, package
        )

    yield add
    for family in installed.values():
        if family.plugin is not None:
            _plugins.manager().unregister(family.plugin)
        for module in list(sys.modules):
            if module.startswith(family.package):
                del sys.modules[module]


def test_a_family_growing_the_trace_context_is_reported(install: object) -> None:
    install("growing", _GROWING)  # type: ignore[operator]
    with pytest.warns(PluginWarning) as caught:
        _plugins.autoload()
    (warning,) = caught
    message = str(warning.message)
    assert "'growing'" in message and "quax_test_growing-dist" in message
    assert "added 1 value to JAX's trace context" in message
    assert "quax.plugins.jit_context(default)" in message
    assert [f.state for f in _plugins.families()] == ["loaded"]


def test_a_family_using_jit_context_loads_silently_and_costs_no_retrace(
    install: object,
) -> None:
    import quax

    install("behaved", _WELL_BEHAVED)  # type: ignore[operator]
    traces = []

    @jax.jit
    def f(x: jax.Array) -> jax.Array:
        traces.append(1)
        return quax.quaxify(jnp.sin)(x)  # the first quaxified call: loads it

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(jnp.ones(3))
        f(jnp.ones(3))
    assert [f.state for f in _plugins.families()] == ["loaded"]
    assert traces == [1]
