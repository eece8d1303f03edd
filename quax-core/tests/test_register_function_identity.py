"""`quax.register_function` runs a rule only for the function it was registered
for, as that function computes with its static arguments at their defaults: not for
another function that JAX records at the same source (two lambdas on one line,
strings run by `exec`, a REPL's statements, which all start at line 1), and not
where a static argument changes what the function computes, unless the rule takes
that argument (`static=`)."""

import functools as ft
import importlib
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing

from .helpers import Refusing


x = jnp.array([1.0, 2.0, -3.0])

# Two functions on one line: JAX records both as "<lambda> at this file:line".
double, triple = jax.jit(lambda a: a * 2), jax.jit(lambda a: a * 3)


@quax.register_function(double)
def _(a: Refusing, *, call: Any) -> Any:
    return Refusing(a.array * 2)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_two_lambdas_on_one_line_are_two_functions(jit: bool) -> None:
    for fn, factor in [(double, 2), (triple, 3)]:
        f = quax.quaxify(fn)
        out = (jax.jit(f) if jit else f)(Refusing(x))
        np.testing.assert_array_equal(out.array, x * factor)


def _from_string(factor: int) -> Any:
    # What `exec`, `python -c` and a REPL give: every function at "<string>:1".
    namespace: dict[str, Any] = {"jax": jax}
    exec(f"@jax.jit\ndef scale(a):\n    return a * {factor}\n", namespace)
    return namespace["scale"]


def test_functions_of_two_strings_at_one_line_are_two_functions() -> None:
    first, second = _from_string(2), _from_string(5)

    @quax.register_function(first)
    def _(a: Refusing, *, call: Any) -> Any:
        return Refusing(a.array * 2)

    np.testing.assert_array_equal(quax.quaxify(first)(Refusing(x)).array, x * 2)
    np.testing.assert_array_equal(quax.quaxify(second)(Refusing(x)).array, x * 5)


def test_a_rule_for_each_of_two_functions_at_one_source() -> None:
    # Two rules, one for each of two functions JAX records at the same source (a
    # REPL statement run again, edited): each function gets its own rule.
    first, second = _from_string(2), _from_string(5)

    @quax.register_function(first)
    def _(a: Refusing, *, call: Any) -> Any:
        return Refusing(a.array * 2 + 100)

    @quax.register_function(second)
    def _(a: Refusing, *, call: Any) -> Any:
        return Refusing(a.array * 5 + 200)

    np.testing.assert_array_equal(quax.quaxify(first)(Refusing(x)).array, x * 2 + 100)
    np.testing.assert_array_equal(quax.quaxify(second)(Refusing(x)).array, x * 5 + 200)


def test_a_module_edited_and_reloaded_runs_its_new_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rule is registered for the module's function; the module is edited (the
    # function keeps its name and line) and reloaded: the new function is not the
    # one the rule was written for.
    module = tmp_path / "quax_test_reloaded.py"
    text = "import jax\n\n@jax.jit\ndef scale(a):\n    return a * {}\n"
    module.write_text(text.format(2))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no stale `.pyc`
    try:
        reloaded = importlib.import_module("quax_test_reloaded")

        @quax.register_function(reloaded.scale)
        def _(a: Refusing, *, call: Any) -> Any:
            return Refusing(a.array * 2 + 100)

        out = quax.quaxify(reloaded.scale)(Refusing(x))
        np.testing.assert_array_equal(out.array, x * 2 + 100)
        module.write_text(text.format(7))
        reloaded = importlib.reload(reloaded)
        out = quax.quaxify(reloaded.scale)(Refusing(x))
        np.testing.assert_array_equal(out.array, x * 7)
    finally:
        sys.modules.pop("quax_test_reloaded", None)


@ft.partial(jax.jit, static_argnames=("scale",))
def scaled(a: Any, scale: float = 2.0) -> Any:
    return a * scale


@quax.register_function(scaled)
def _(a: Refusing, *, call: Any) -> Any:
    # Written for the default `scale`: another one must not reach it.
    return Refusing(a.array * 2.0 + 100)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_static_argument_off_its_default_runs_the_body(jit: bool) -> None:
    def f(a: Any, scale: float) -> Any:
        return quax.quaxify(lambda a: scaled(a, scale=scale))(a)

    g = jax.jit(f, static_argnums=1) if jit else f
    np.testing.assert_array_equal(g(Refusing(x), 2.0).array, x * 2.0 + 100)
    np.testing.assert_array_equal(g(Refusing(x), 5.0).array, x * 5.0)
    # Passed positionally, it is still a static argument.
    out = quax.quaxify(lambda a: scaled(a, 5.0))(Refusing(x))
    np.testing.assert_array_equal(out.array, x * 5.0)


@ft.partial(jax.jit, static_argnames=("mode",))
def combined(a: Any, b: Any, mode: str = "add") -> Any:
    return a + b if mode == "add" else a - b if mode == "sub" else a * b


@quax.register_function(combined, static={"mode": ("sub",)})
def _(a: Refusing, b: Refusing, *, call: Any, mode: str = "add") -> Any:
    # Handles "add" and "sub" (each + 100, to see that the rule ran), not "mul".
    return Refusing((a.array + b.array if mode == "add" else a.array - b.array) + 100)


def test_a_rule_receives_the_static_arguments_it_declares() -> None:
    y = jnp.array([0.5, 4.0, 1.0])

    def f(mode: str) -> Any:
        return quax.quaxify(lambda a, b: combined(a, b, mode=mode))(
            Refusing(x), Refusing(y)
        )

    np.testing.assert_array_equal(f("add").array, x + y + 100)
    np.testing.assert_array_equal(f("sub").array, x - y + 100)
    # A value the registration does not list: the body runs.
    mul = f("mul")
    np.testing.assert_array_equal(mul.array, x * y)


def test_a_rule_not_taking_a_declared_static_argument_is_refused() -> None:
    with pytest.raises(TypeError, match=r"`mode`.*keyword parameter"):

        @quax.register_function(combined, static={"mode": ("mul",)})
        def _(a: Refusing, b: Refusing, *, call: Any) -> Any:
            return a

    with pytest.raises(TypeError, match=r"`unknown` is not a parameter of `combined`"):
        quax.register_function(combined, static={"unknown": (1,)})


class Opaque(quax.ArrayValue):
    """A value no primitive rule takes, which refuses to materialise: only a
    `register_function` rule computes with it."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> Any:
        raise RuntimeError("Opaque values never materialise")


@ft.partial(jax.jit, static_argnames=("scale",))
def opaque_scaled(a: Any, scale: float = 2.0) -> Any:
    return a * scale


@quax.register_function(opaque_scaled)
def _(a: Opaque, *, call: Any) -> Any:
    return Opaque(a.array * 2.0)


def test_an_error_of_a_body_run_in_place_of_the_rule_says_why() -> None:
    out = quax.quaxify(opaque_scaled)(Opaque(x))
    np.testing.assert_array_equal(out.array, x * 2.0)
    with pytest.raises(RuntimeError, match="never materialise") as e:
        quax.quaxify(lambda a: opaque_scaled(a, scale=5.0))(Opaque(x))
    note = " ".join(getattr(e.value, "__notes__", []))
    assert "for `opaque_scaled` did not run" in note
    assert "a static argument (`jax.jit`'s `static_argnames`)" in note
    assert "quax.register_function(f, static=...)" in note


def test_a_function_wrapping_no_jit_is_refused() -> None:
    def plain(a: Any) -> Any:
        return a * 2

    with pytest.raises(TypeError, match=r"wraps no `jax.jit`"):
        quax.register_function(plain)


SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    from jax.sharding import AxisType, PartitionSpec as P
    import quax
    from tests.helpers import Refusing

    @jax.jit
    def doubled(a):
        return a * 2

    @quax.register_function(doubled)
    def _(a: Refusing, *, call):
        return Refusing(a.array * 2 + 100)  # + 100: the rule ran

    x = jnp.arange(4.0)
    want = x * 2 + 100
    # Inside `shard_map` the body's arguments vary along the manual axis.
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Auto,))
    f = lambda a: jax.shard_map(
        doubled, mesh=mesh, in_specs=P("x"), out_specs=P("x")
    )(a)
    assert jnp.array_equal(quax.quaxify(f)(Refusing(x)).array, want)
    assert jnp.array_equal(jax.jit(quax.quaxify(f))(Refusing(x)).array, want)
    # Under a mesh of explicit axes they carry their sharding.
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, P("x"))
        assert jnp.array_equal(quax.quaxify(doubled)(Refusing(xs)).array, want)
        out = jax.jit(quax.quaxify(doubled))(Refusing(xs))
        assert jnp.array_equal(out.array, want)
    print("ok")
    """
)


def test_the_rule_runs_on_sharded_arguments() -> None:
    # The body is traced again on JAX's own argument types: with their sharding
    # and the manual axes they vary along, else it differs and the rule is lost.
    path = os.pathsep.join(
        [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    out = quax.testing.run_on_simulated_devices(SHARDED, n=2, env={"PYTHONPATH": path})
    assert out.strip().endswith("ok")
