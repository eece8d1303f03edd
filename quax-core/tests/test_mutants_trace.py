"""Tests written for mutants of the core's trace and dispatch (`quax/_transform/`,
`quax/_dispatch/`) that a sampled run of `scripts/mutation.sh` let through (see
`docs/mutation.md`), each failing with its mutant planted: which resolutions the
dispatch cache may keep, and its bound."""

import functools as ft
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Int
from quax._dispatch import _registry
from quax._foundation import _debug, _journal

from .helpers import (
    CHECKPOINT_LOWER,
    CHECKPOINT_UPPER,
    Dense,
    Refusing,
    Scaled,
    checkpoint_building_values,
)


X = jnp.array([0.5, -1.5, 2.25, 3.0])


class ByDtype(Dense):
    """A `Dense` whose power notes which rule made it."""

    rule: str = eqx.field(static=True, default="")


@quax.register(lax.pow_p)
def _(x: ByDtype, y: Float[Array, "..."]) -> ByDtype:
    return ByDtype(lax.pow(x.array, y), "float")


@quax.register(lax.pow_p)
def _(x: ByDtype, y: Int[Array, "..."]) -> ByDtype:
    return ByDtype(lax.pow(x.array, y), "int")


@pytest.mark.parametrize("caching", [True, False], ids=["cached", "uncached"])
def test_rules_chosen_by_more_than_types_are_never_cached_by_types(
    caching: bool,
) -> None:
    """Two rules told apart by their exponent's dtype (jaxtyping's `Float[...]`,
    `Int[...]`), where the Python type of both exponents is one: each power runs
    its own rule, with the caches on as off (mutant `rule_for` 27 cached the first
    resolution of the primitive and its types, and the integer exponent got the
    float rule)."""
    power = quax.quaxify(lax.pow)
    with quax.caching(caching):
        by_float = power(ByDtype(X), jnp.asarray(2.0, jnp.float32))
        by_int = power(ByDtype(X), jnp.asarray(3, jnp.int32))
    assert (by_float.rule, by_int.rule) == ("float", "int")
    # The backend's float32 tolerance: a TPU's float32 `pow` is an approximation
    # (2.25 ** 2 gave 5.062486 on a TPU v5e).
    tolerance = quax.testing.tolerance(jnp.float32)
    np.testing.assert_allclose(by_float.array, np.asarray(X) ** 2, **tolerance)
    np.testing.assert_allclose(by_int.array, np.asarray(X) ** 3, **tolerance)


@pytest.mark.caching_behaviour
def test_the_dispatch_cache_starts_afresh_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dispatch cache holds at most `MAX_DISPATCH` resolutions: at the bound
    it starts afresh (mutant `rule_for` 40 let it reach one more)."""
    monkeypatch.setattr(_registry, "MAX_DISPATCH", 2)
    _registry._cache.clear()
    for primitive in (lax.sin_p, lax.cos_p, lax.neg_p):
        rule: Any = _registry.rule_for(primitive, [Dense(X)])
        assert len(_registry._cache) <= 2
        assert _registry._cache[(primitive, (Dense,))] is rule
    np.testing.assert_array_equal(rule([Dense(X)], {}).array, -X)


class ScaledBy(Dense):
    """A `Dense` that a primitive of a test's own multiplies by a plain array."""


@pytest.mark.caching_behaviour
def test_rules_on_value_types_and_jax_arrays_are_cached_by_types() -> None:
    """A rule annotated with a value type and `jax.Array` is decided by the input
    types, so its resolution is kept in the dispatch cache (mutants
    `_decided_by_types` 6 and 15 counted `jax.Array`, or a value type's class,
    equinox's, as not deciding: every call of the primitive resolved afresh). The
    primitive is the test's own, so that its rule is the only one registered for it
    (a primitive's resolutions are cached only where all of its rules are decided
    by types), and registered here, where mutmut sees the test reach the check."""
    scale_p = jax.extend.core.Primitive("quax_test_scale")
    scale_p.def_abstract_eval(lambda x, y: x)

    @quax.register(scale_p)
    def _(x: ScaledBy, y: jax.Array) -> ScaledBy:
        return ScaledBy(x.array * y)

    values = [ScaledBy(X), jnp.asarray(X)]
    rule: Any = _registry.rule_for(scale_p, values)
    assert _registry._cache[(scale_p, (ScaledBy, type(values[1])))] is rule
    np.testing.assert_array_equal(rule(values, {}).array, np.asarray(X) ** 2)
    out = quax.quaxify(scale_p.bind)(ScaledBy(X), jnp.asarray(X))
    np.testing.assert_array_equal(out.array, np.asarray(X) ** 2)


class Swapped(Dense):
    """A second value type for the test's own primitive below."""


def test_a_failed_load_takes_back_only_its_own_rules() -> None:
    """A rule registered in a block that raises (a family failing half-way through
    its registration) is taken back: a new rule is removed, a replaced one comes
    back, and the rules registered before the block stay (mutant `_withdraw` 7
    took back the first registration that was not the one to take back). The
    primitive's own evaluation, for plain arrays, adds; the rules multiply or
    subtract, so each result says which ran."""
    combine_p = jax.extend.core.Primitive("quax_test_combine")
    combine_p.def_impl(lambda x, y: x + y)
    combine_p.def_abstract_eval(lambda x, y: x)

    @quax.register(combine_p)
    def _(x: ScaledBy, y: jax.Array) -> ScaledBy:
        return ScaledBy(x.array * y)

    combine = quax.quaxify(combine_p.bind)
    x = np.asarray(X)
    with (
        pytest.raises(RuntimeError, match="half-way"),
        _journal.all_or_nothing(),
    ):

        @quax.register(combine_p)
        def _(x: Swapped, y: jax.Array) -> Swapped:
            return Swapped(x.array * y)

        np.testing.assert_array_equal(combine(Swapped(X), X).array, x * x)
        raise RuntimeError("the family failed half-way")
    # The rule registered before the block stays; the new one is gone, and a
    # `Swapped` goes to its type's default, the primitive's own evaluation.
    np.testing.assert_array_equal(combine(ScaledBy(X), X).array, x * x)
    np.testing.assert_array_equal(combine(Swapped(X), X).array, x + x)
    with (
        pytest.raises(RuntimeError, match="half-way"),
        _journal.all_or_nothing(),
    ):

        @quax.register(combine_p)
        def _(x: ScaledBy, y: jax.Array) -> ScaledBy:
            return ScaledBy(x.array - y)

        np.testing.assert_array_equal(combine(ScaledBy(X), X).array, x - x)
        raise RuntimeError("the family failed half-way")
    # The rule it replaced is back.
    np.testing.assert_array_equal(combine(ScaledBy(X), X).array, x * x)


def test_registering_a_function_names_the_primitive_to_register() -> None:
    """`quax.register(jnp.add)` is refused, saying what it expects, what it got and
    how to find the primitive (mutant `_check_primitive` 6 changed the case of the
    way out)."""
    with pytest.raises(TypeError) as refusal:
        quax.register(jnp.add)  # pyright: ignore[reportArgumentType]
    message = str(refusal.value)
    assert message.startswith(
        "quax.register expects a JAX primitive, such as `jax.lax.add_p` or "
        "`jax.lax.dot_general_p`; got "
    ), message
    assert message.endswith(
        "Functions such as `jnp.add` or `jax.lax.add` bind primitives; register the "
        "primitive itself (find it with `jax.make_jaxpr(f)(x)`, which names each "
        "primitive a function binds)."
    ), message


def test_a_value_left_out_by_a_filter_spec_is_materialised_by_jax_numpy() -> None:
    """A value that a `filter_spec` leaves out passes into the quaxified function
    unchanged; where a `jax.numpy` function asks it for an array, it is
    materialised, as outside quax (mutant `_jax_array` 6 asked the type of `None`
    to materialise it: an `AttributeError`)."""
    f = quax.quaxify(lambda x, d: jnp.sin(d) + x, filter_spec=(True, (True, False), {}))
    out = f(Dense(X), Dense(2 * X))
    assert type(out) is Dense
    np.testing.assert_allclose(
        out.array, np.sin(2 * np.asarray(X)) + np.asarray(X), rtol=1e-6
    )


def test_an_eager_operators_result_is_a_tracer_to_jax_transforms() -> None:
    """Eagerly, an operator on a value inside a quaxified function (`v * 2.0`) runs
    as one compiled program; its result is a tracer of the quax trace, which
    `jax.vmap` maps as the array it stands for (mutant `_eager_operator` 35 left it
    a bare value, whose leaves `vmap` then mapped one by one: a `Scaled`'s scalar
    scale cannot be, a `ValueError`)."""
    array = jnp.arange(8.0).reshape(2, 4)
    f = quax.quaxify(lambda v: jax.vmap(jnp.sum)(v * 2.0))
    previous = quax.set_eager_compilation(True)
    try:
        for _ in range(3):  # the later calls run the compiled program
            out = f(Scaled(array, jnp.asarray(3.0)))
            np.testing.assert_array_equal(out, (np.asarray(array) * 6.0).sum(axis=1))
    finally:
        quax.set_eager_compilation(previous)


@pytest.mark.parametrize("jitted", [False, True])
def test_rules_run_without_debug_checks(jitted: bool) -> None:
    """With debug checks off (the default outside the tests), a rule is called
    directly, not through the checked call: a value's product and negation,
    eagerly and under `jit`, against NumPy (mutant `_run_rule` 34 called `None` on
    that path, a `TypeError` for every rule)."""
    a = np.array([0.5, -1.5, 2.25, 3.0], np.float32)

    def f(v: Any) -> Any:
        return -(v * 3.0)

    g = quax.quaxify(jax.jit(f) if jitted else f)
    previous = _debug.is_enabled()
    quax.set_debug_checks(False)
    try:
        out = g(Scaled(jnp.asarray(a), jnp.asarray(2.0, jnp.float32)))
    finally:
        quax.set_debug_checks(previous)
    assert isinstance(out, Scaled)
    np.testing.assert_allclose(np.asarray(out.materialise()), -(a * 2.0 * 3.0))


def test_a_catch_all_rule_catching_another_owners_type_is_warned_of_in_full() -> None:
    """A rule annotating none of its positional parameters that catches a value
    type of another owner is warned of, ending with the way out word for word
    (mutant `_warn_if_foreign` 38 lower-cased its example's types)."""
    caught_p = jax.extend.core.Primitive("mutant_catch_all")
    caught_p.def_impl(lambda x: 2 * x)
    caught_p.def_abstract_eval(lambda x: x)

    def unannotated(x, **params):
        del params
        return Dense(x.array * 3.0)

    unannotated.__module__ = "someone_else._rules"
    quax.register(caught_p)(unannotated)
    with pytest.warns(quax.RuleConflictWarning) as caught:
        out = quax.quaxify(caught_p.bind)(Dense(X))
    message = str(caught[0].message)
    assert message.startswith("The quax rule someone_else._rules.")
    assert message.endswith(
        "of another distribution than the rule's (someone_else), which has no "
        "rule of its own for `mutant_catch_all` here. Annotate the inputs the "
        "rule handles, e.g. `def _(x: MyArray, y: ArrayLike, **params)`."
    )
    np.testing.assert_array_equal(out.array, np.asarray(X) * 3.0)


@ft.partial(jax.jit, inline=True)
def _tripled(a: Any) -> Any:
    return a * 3.0


@quax.register_function(_tripled)
def _(a: ByDtype) -> ByDtype:
    return ByDtype(a.array * 3.0, "tripled")


def test_a_function_rule_without_the_call_param_is_refused_naming_it() -> None:
    """A `register_function` rule that takes neither `call` nor `**params` is
    refused when quax calls it with `call`, naming the function and the param
    (mutant `registered_rule` 22 made the rule without its primitive: an
    `AttributeError` of `None` instead)."""
    with pytest.raises(
        TypeError,
        match=r"for primitive `_tripled \(jitted function\)` does not take the "
        r"param `call`, and JAX binds `_tripled \(jitted function\)` with `call=",
    ):
        quax.quaxify(_tripled)(ByDtype(X, ""))


@pytest.mark.caching_behaviour
def test_a_primitive_without_rules_has_its_default_resolution_cached() -> None:
    """A primitive that no rule is registered for resolves to the value type's
    `default` by types alone, and that resolution is kept in the dispatch cache
    like any other (mutant `rule_for` 30: a primitive absent from the table of
    those decided by types counted as not decided, resolved afresh on every call).
    The primitive is the test's own, so that nothing registers a rule for it."""
    double_p = jax.extend.core.Primitive("quax_test_double")
    double_p.def_impl(lambda x: 2 * x)
    double_p.def_abstract_eval(lambda x: x)
    rule: Any = _registry.rule_for(double_p, [Dense(X)])
    assert _registry._cache[(double_p, (Dense,))] is rule
    np.testing.assert_array_equal(rule([Dense(X)], {}).array, 2 * np.asarray(X))


class Checkpointed(Dense):
    """A `Dense` that a test's own rule for `jax.checkpoint` (`remat_p`) takes."""


def test_a_checkpoint_whose_body_builds_values_takes_the_cores_rule() -> None:
    """`jax.checkpoint` of plain operands whose body builds values goes to the
    core's rule, which re-runs the body on the quax trace, even where a family's
    rule takes its values or arrays (`Checkpointed | ArrayLike`, the more specific
    signature) and runs the body as plain JAX: the result is the `Refusing` value,
    as NumPy's `where` gives its array (mutant `process_primitive` 37 resolved the
    rule from the registry, the family's, whose plain JAX met the staged value and
    was refused). The family's rule is taken back afterwards."""
    x = jnp.array([0.5, 1.0, 2.0])
    with (
        pytest.raises(RuntimeError, match="taken back"),
        _journal.all_or_nothing(),
    ):

        @quax.register(jax.extend.core.primitives.remat_p)
        def _(*args: Checkpointed | ArrayLike, jaxpr: Any, **params: Any) -> Any:
            del params
            arrays = [a.array if isinstance(a, Checkpointed) else a for a in args]
            return jax.core.eval_jaxpr(jaxpr, (), *arrays)

        got = quax.quaxify(checkpoint_building_values)(x)
        assert type(got) is Refusing
        want = np.where(x > CHECKPOINT_LOWER, x, CHECKPOINT_UPPER)
        np.testing.assert_array_equal(got.array, want)
        raise RuntimeError("the family's rule is taken back")


@jax.custom_vjp
def _cubed(x: jax.Array) -> jax.Array:
    return x**3


def _cubed_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x**3, x


def _cubed_bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (3.0 * x**2 * g,)


_cubed.defvjp(_cubed_fwd, _cubed_bwd)


def test_a_custom_vjp_function_on_a_value_runs_under_the_quax_trace() -> None:
    """A `jax.custom_vjp` function called on a value inside `quax.quaxify` goes to
    the trace's rule for it, with the output trees JAX passes: its result is the
    value of the cubes, and its gradient through the value that of its own
    `bwd`, as plain JAX's (mutant `process_custom_vjp_call` 19 called the rule
    without the output trees: a `TypeError`)."""
    x = np.asarray(X)
    out = quax.quaxify(_cubed)(Dense(X))
    assert type(out) is Dense
    np.testing.assert_allclose(out.array, x**3, rtol=1e-6)
    grad = jax.grad(lambda a: quax.quaxify(_cubed)(Dense(a)).array.sum())(X)
    np.testing.assert_allclose(grad, jax.grad(lambda a: _cubed(a).sum())(X))
    np.testing.assert_allclose(grad, 3.0 * x**2, rtol=1e-6)
