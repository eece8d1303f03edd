"""Tests written for mutants of `quax/_transform/_interpreter.py` that a sampled run
of `scripts/mutation.sh transform-interpreter` let through (see `docs/mutation.md`),
each failing with its mutant planted."""

from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._foundation._caches
from jax import lax
from quax._foundation import _debug
from quax._transform import _interpreter

from .helpers import Dense, Refusing


def test_verify_mode_tells_changed_steps_apart(
    verifying: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interpreter's steps of a jaxpr are worked out once and kept; verify mode
    reads them afresh at each hit and compares field by field. A reading that
    differs in one field of one step (here whether an equation may be computed at
    trace time) is a mismatch; the same reading is not (mutant `_same_steps` 5
    counted any two distinct objects as the same)."""
    del verifying
    closed = jax.make_jaxpr(lambda a: jnp.sin(a) * 2.0)(jnp.ones(3))
    kept = _interpreter._steps_of(closed.jaxpr)
    assert _interpreter._steps_of(closed.jaxpr) is kept  # a hit, verified
    read = _interpreter._read_steps

    def misread(jaxpr: Any) -> list[Any]:
        first, *rest = read(jaxpr)
        return [first._replace(foldable=not first.foldable), *rest]

    monkeypatch.setattr(_interpreter, "_read_steps", misread)
    with pytest.raises(quax.CacheMismatchError, match="its equations' steps"):
        _interpreter._steps_of(closed.jaxpr)


def _primitives(jaxpr: Any) -> set[str]:
    """The names of the primitives a jaxpr binds, in its sub-jaxprs too."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for p in eqn.params.values():
            for sub in p if isinstance(p, tuple) else (p,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    names |= _primitives(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    names |= _primitives(sub)
    return names


def test_a_large_output_on_constants_is_staged_not_computed() -> None:
    """An equation on constants only is computed at trace time only where its
    outputs are small (`FOLD_MAX_SIZE`): `relu` (a `custom_jvp`, whose primitive
    makes its own bind params) of a closed-over array of more elements stays in the
    program, as plain JAX stages it (mutant `eval_quaxified` 38 computed every
    foldable-or-constant equation)."""
    big = np.linspace(-1.0, 1.0, _interpreter.FOLD_MAX_SIZE + 1, dtype=np.float32)
    lib = jax.jit(lambda a: a * jnp.sum(jax.nn.relu(big)))
    x = jnp.ones(3)
    assert "custom_jvp_call" in _primitives(jax.make_jaxpr(lib)(x).jaxpr)
    closed = jax.make_jaxpr(quax.quaxify(lib))(Dense(x))
    assert "custom_jvp_call" in _primitives(closed.jaxpr)
    np.testing.assert_allclose(
        quax.quaxify(lib)(Dense(x)).array, x * np.maximum(big, 0).sum(), rtol=1e-6
    )


def test_a_refused_join_says_where_the_body_is() -> None:
    """A loop carry that cannot be joined is named by the body's argument and by
    where the body is defined (mutant `body_source` 1 dropped the place)."""

    def scan_body(c: Any, xi: Any) -> tuple[Any, Any]:
        return c + xi, xi

    f = lambda a: lax.scan(scan_body, jnp.zeros(()), a)[0]
    with pytest.raises(
        quax.JoinError,
        match=r"loop carry `c` of a scan \(body scan_body at \S*"
        r"test_mutants_interpreter\.py:\d+\)",
    ):
        quax.quaxify(f)(Refusing(jnp.arange(3.0)))


def test_where_a_body_is_defined_is_read_from_open_and_closed_jaxprs() -> None:
    """`body_source` reads where a traced body is defined from a closed jaxpr (a
    `scan`'s, a `jit`'s) and from an open one alike: the function's name, its file
    and its first line (mutant `body_source` 12 read `.jaxpr` of an open jaxpr
    too, which has none: an `AttributeError`)."""

    def traced_body(a: jax.Array) -> jax.Array:
        return jnp.sin(a) * 2.0

    closed = jax.make_jaxpr(traced_body)(jnp.ones(3))
    code = traced_body.__code__
    want = f"traced_body at {code.co_filename}:{code.co_firstlineno}"
    assert _interpreter.body_source(closed) == want
    assert _interpreter.body_source(closed.jaxpr) == want


class Tripled(Dense):
    """A `Dense` whose rule for `pair_p` below gives one output too many."""


pair_p = jax.extend.core.Primitive("quax_test_pair")
pair_p.multiple_results = True
pair_p.def_impl(lambda x: [x, 2 * x])
pair_p.def_abstract_eval(lambda x: [x, x])


@quax.register(pair_p)
def _(x: Tripled) -> list[Tripled]:
    return [Tripled(x.array), Tripled(2 * x.array), Tripled(3 * x.array)]


def test_a_rule_giving_more_outputs_than_its_primitive_is_never_cut() -> None:
    """Without debug checks, which name the rule, a rule giving a primitive of
    several outputs one output too many fails where a `jit`'s jaxpr is run under
    quax, rather than having its last output dropped unseen (mutant
    `eval_quaxified` 93 zipped the equation's outputs with the rule's leniently).
    With debug checks, the error names the rule and the counts."""
    f = quax.quaxify(jax.jit(lambda x: pair_p.bind(x)[1]))
    previous = _debug.is_enabled()
    quax.set_debug_checks(False)
    try:
        with pytest.raises(ValueError, match="zip"):
            f(Tripled(jnp.arange(3.0)))
        quax.set_debug_checks(True)
        with pytest.raises(
            Exception, match="returned 3 outputs; `quax_test_pair` has 2"
        ):
            f(Tripled(jnp.arange(3.0)))
    finally:
        quax.set_debug_checks(previous)


def test_equations_that_bind_as_bind_does_are_read_to_skip_binds_checks() -> None:
    """A jaxpr's steps keep each equation's bind params, and mark the equations of
    primitives that bind as `Primitive.bind` does (`sin`, `mul`) to skip `bind`'s
    checks on tracers; a primitive with its own `get_bind_params` (a custom
    derivative, `jax.nn.relu`) has its params built at each evaluation, and goes
    through `bind` (mutant `_read_steps` 3: every equation's params left to be
    built, so that no equation ever took the direct path, a cost on every traced
    equation of every inlined `jit`)."""
    closed = jax.make_jaxpr(lambda a: jax.nn.relu(jnp.sin(a) * 2.0))(jnp.ones(3))
    steps = {s.primitive.name: s for s in _interpreter._read_steps(closed.jaxpr)}
    eqns = {e.primitive.name: e for e in closed.jaxpr.eqns}
    for name in ("sin", "mul"):
        assert steps[name].direct
        assert steps[name].params == eqns[name].params
    assert steps["custom_jvp_call"].params is None
    assert not steps["custom_jvp_call"].direct
