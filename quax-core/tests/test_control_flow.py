"""Control flow, nested jit, checkpoint, linear solves and callbacks inside quaxify.

Every program runs on a `Refusing` value (which raises if materialised), so passing
proves the body ran on the structured value; results and gradients are compared with
the same program on plain arrays, under `vmap` in both orders too.
"""

import equinox.internal as eqxi
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from quax.zero import Zero

from .helpers import (
    Dense,
    Liftable,
    RefusedMaterialisation,
    Refusing,
    Wrapper,
    dense,
)


x = jnp.array([0.5, 1.0, 2.0, 3.0])

PROGRAMS = {
    "jit": lambda a: jax.jit(lambda b: jnp.sin(b) * 2)(a),
    "jit_inline": lambda a: jax.jit(lambda b: jnp.sin(b) * 2, inline=True)(a),
    "cond": lambda a: lax.cond(True, lambda b: b * 2, lambda b: b + 1, a),
    "cond_data": lambda a: lax.cond(jnp.sum(a) > 0, lambda b: b * 2, jnp.sin, a),
    "switch": lambda a: lax.switch(1, [lambda b: b * 2, lambda b: b + 1, jnp.cos], a),
    "while": lambda a: lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5), (0, a)
    )[1],
    "fori": lambda a: lax.fori_loop(0, 3, lambda i, c: jnp.sin(c) * 2, a),
    "scan": lambda a: lax.scan(lambda c, xi: (c * xi, c + xi), a, jnp.ones((3, 4)))[0],
    "scan_xs": lambda a: lax.scan(
        lambda c, xi: (c + 1.0, xi * 2), jnp.zeros(()), a.reshape(2, 2)
    )[1].reshape(4),
    "map": lambda a: lax.map(lambda r: r * 2, a),
    "associative_scan": lambda a: lax.associative_scan(jnp.add, a),
    "checkpoint": lambda a: jax.checkpoint(lambda b: jnp.sin(b) * b)(a),
    "checkpoint_policy": lambda a: jax.checkpoint(
        lambda b: jnp.sin(b) * b, policy=jax.checkpoint_policies.nothing_saveable
    )(a),
    "linear_solve": lambda a: lax.custom_linear_solve(
        lambda v: v * 2, a, lambda mv, b: b / 2, symmetric=True
    ),
    "custom_root": lambda a: lax.custom_root(
        lambda y: y * y - a,
        jnp.ones(4),
        lambda f, y0: jnp.sqrt(a),
        lambda g, y: y / (2 * jnp.sqrt(a)),
    ),
    "stop_gradient": lambda a: lax.stop_gradient(a) * a,
    # An identity that refuses reverse mode (diffrax's implicit solvers bind it).
    "nondifferentiable_backward": lambda a: eqxi.nondifferentiable_backward(a) * 2,
    "debug_print": lambda a: (jax.debug.print("{}", a), a * 2)[1],
    "debug_callback": lambda a: (jax.debug.callback(lambda v: None, a), a * 2)[1],
}
# Reverse mode is undefined for these in JAX itself (or refused by equinox).
NO_REVERSE = {"while", "nondifferentiable_backward"}
# The forward pass of `grad(switch)` returns residuals that are plain in one branch
# and a value in another: joining them needs materialising (see `test_join_*`).
JOINS_UNDER_GRAD = {"switch", "cond_data"}


def quaxed(f, wrap=Refusing):
    return lambda a: dense(quax.quaxify(f)(wrap(a)))


@pytest.mark.parametrize("name", PROGRAMS)
def test_forward(name):
    f = PROGRAMS[name]
    out = quax.quaxify(f)(Refusing(x))
    assert isinstance(out, Refusing)
    assert jnp.allclose(dense(out), f(x), atol=1e-5)
    assert jnp.allclose(jax.jit(quaxed(f))(x), f(x), atol=1e-5)


@pytest.mark.parametrize("name", PROGRAMS)
def test_vmap(name):
    f = PROGRAMS[name]
    xs = jnp.stack([x, x + 1])
    expected = jax.vmap(f)(xs)
    assert jnp.allclose(jax.vmap(quaxed(f))(xs), expected, atol=1e-5)
    assert jnp.allclose(
        dense(quax.quaxify(jax.vmap(f))(Refusing(xs))), expected, atol=1e-5
    )


@pytest.mark.parametrize("name", PROGRAMS)
def test_grad(name):
    f = PROGRAMS[name]
    loss = lambda a: jnp.sum(f(a) ** 2)
    if name in NO_REVERSE:
        expected = jax.jvp(loss, (x,), (jnp.ones(4),))[1]
        got = jax.jvp(lambda a: jnp.sum(quaxed(f)(a) ** 2), (x,), (jnp.ones(4),))[1]
        assert jnp.allclose(got, expected, rtol=1e-4)
        return
    expected = jax.grad(loss)(x)
    # grad of quaxify
    got = jax.grad(lambda a: jnp.sum(quaxed(f)(a) ** 2))(x)
    assert jnp.allclose(got, expected, rtol=1e-4)
    # quaxify of grad
    wrap = Dense if name in JOINS_UNDER_GRAD else Refusing
    got = dense(quax.quaxify(jax.grad(loss))(wrap(x)))
    assert jnp.allclose(got, expected, rtol=1e-4)


def test_join_refused_names_the_carry():
    # The carry starts plain and becomes a value: joining needs materialising.
    f = lambda a: lax.scan(lambda c, xi: (c + xi, xi), jnp.zeros(()), a)[0]
    with pytest.raises(quax.JoinError, match=r"loop carry `c` of a scan.*Refusing"):
        quax.quaxify(f)(Refusing(x))


def test_join_errors_name_the_users_carry():
    # fori_loop puts its counter first, and while_loop drops carries the body
    # leaves unchanged: errors still name the carry as the body's argument.
    fori = lambda a: lax.fori_loop(
        0, 3, lambda i, c: (c[0] + c[1], c[1]), (jnp.zeros(4), a)
    )[0]
    with pytest.raises(quax.JoinError, match=r"loop carry `c\[0\]` of a .*Refusing"):
        quax.quaxify(fori)(Refusing(x))
    loop = lambda a: lax.while_loop(
        lambda c: c[0] < 3,
        lambda c: (c[0] + 1, c[1], c[2] + c[1]),
        (0, a, jnp.zeros(4)),
    )[2]
    with pytest.raises(
        quax.JoinError, match=r"loop carry `c\[2\]` of a while_loop.*Refusing"
    ):
        quax.quaxify(loop)(Refusing(x))


def test_join_lifts_plain_carry():
    # A plain carry that becomes a value is lifted by the type's `lift`: no
    # materialisation (`Liftable` refuses it).
    f = lambda a: lax.scan(lambda c, xi: (c + xi, xi), jnp.zeros(()), a)[0]
    out = quax.quaxify(f)(Liftable(x))
    assert isinstance(out, Liftable) and jnp.allclose(out.array, jnp.sum(x))
    fori = lambda a: lax.fori_loop(0, 3, lambda i, c: c + a, jnp.zeros(4))
    out = jax.jit(quax.quaxify(fori))(Liftable(x))
    assert isinstance(out, Liftable) and jnp.allclose(out.array, 3 * x)


@pytest.mark.parametrize("jit", [False, True])
def test_grad_through_loop_with_value_carry(jit):
    # The cotangent carry starts as JAX's plain zeros and becomes a value; under
    # `jit` the zeros are tracers whose value quax reads off the trace.
    def loss(v, y):
        step = lambda i, c: (c[0] + 0.1 * c[1], c[1] * 0.9)
        return jnp.sum(lax.fori_loop(0, 10, step, (y, v))[0] * y)

    grad = quax.quaxify(jax.grad(loss))
    grad = jax.jit(grad) if jit else grad
    out = grad(Liftable(x), Liftable(x + 1))
    assert isinstance(out, Liftable)
    assert jnp.allclose(out.array, jax.grad(loss)(x, x + 1), rtol=1e-5)


def test_zero_carry_joins_dense():
    f = lambda z: lax.fori_loop(0, 3, lambda i, c: c + 1.0, z)
    out = quax.quaxify(f)(Zero((4,), jnp.float32))
    assert not isinstance(out, quax.Value) and jnp.allclose(out, 3.0)
    g = lambda z: lax.scan(lambda c, xi: (c * xi, c), z, jnp.ones((3, 4)))[1]
    out = quax.quaxify(g)(Zero((4,), jnp.float32))
    assert jnp.allclose(quax.quaxify(lambda o: o * 1.0)(out), 0.0)


def test_cond_lifts_plain_branch():
    f = lambda p, a: lax.cond(p, lambda b: b * 2, lambda b: jnp.zeros(4), a)
    out = quax.quaxify(f)(False, Liftable(x))
    assert isinstance(out, Liftable) and jnp.allclose(out.array, 0.0)


def test_linear_solve_plain_rhs_value_operator():
    # `b` is plain, `matvec` returns a value: inverting a matrix held in a value.
    m = jnp.array([[4.0, 1.0, 0.5], [1.0, 3.0, -0.2], [0.5, -0.2, 2.0]])
    out = quax.quaxify(jnp.linalg.inv)(Dense(m))
    assert jnp.allclose(dense(out), jnp.linalg.inv(m), atol=1e-5)
    out = quax.quaxify(jnp.linalg.inv)(Liftable(m))  # lifted `b`: nothing densified
    assert isinstance(out, Liftable)
    assert jnp.allclose(out.array, jnp.linalg.inv(m), atol=1e-5)


def test_join_materialises_only_what_differs():
    f = lambda a, b: lax.scan(
        lambda c, xi: ((c[0] + xi, c[1] * 2), xi), (jnp.zeros(()), b), a
    )[0]
    with quax.track_materialisation() as report:
        c0, c1 = quax.quaxify(f)(Dense(x), Refusing(x))
    assert isinstance(c1, Refusing)  # the stable carry stays structured
    assert jnp.allclose(c0, jnp.sum(x)) and jnp.allclose(c1.array, x * 16)
    assert report.total > 0


def test_cond_branch_types_joined():
    # A predicate known only at run time: both branches' types must join.
    f = jax.jit(
        quax.quaxify(
            lambda p, a: lax.cond(p, lambda b: b * 2, lambda b: jnp.zeros(4), a)
        )
    )
    out = f(True, Dense(x))
    assert jnp.allclose(dense(out), x * 2)
    with pytest.raises(quax.JoinError, match="output 0 of a cond"):
        f(True, Refusing(x))


def _known_branches(a):
    kept = lax.cond(True, lambda b: b * 2, lambda b: jnp.zeros(4), a)
    dropped = lax.switch(2, [jnp.sin, lambda b: b, lambda b: jnp.ones(4)], a)
    return kept, dropped


@pytest.mark.parametrize(
    "wrap",
    [lambda f: jax.jit(quax.quaxify(f)), lambda f: quax.quaxify(jax.jit(f))],
    ids=["jit_of_quaxify", "quaxify_of_jit"],
)
def test_cond_known_at_trace_time_runs_one_branch(wrap):
    # `lax.cond(True, ...)` under `jit`, as a solver writes for a static option: the
    # branch is a constant of the program, so only it ever runs, and the other's
    # type (here plain, which `Refusing` cannot join) does not matter.
    kept, dropped = wrap(_known_branches)(Refusing(x))
    assert isinstance(kept, Refusing) and jnp.allclose(kept.array, x * 2)
    assert not isinstance(dropped, quax.Value) and jnp.allclose(dropped, 1.0)


def test_cond_index_computed_from_constants_under_jit():
    # The index is a constant of the program, computed by equations on constants
    # (a chain of 20 doublings, each reading the last result twice).
    def f(a):
        total = jnp.ones(())
        for _ in range(20):
            total = total + total
        index = (total > 0).astype(jnp.int32)
        return lax.switch(index, [lambda b: jnp.zeros(4), lambda b: b * 2], a)

    out = jax.jit(quax.quaxify(f))(Refusing(x))
    assert isinstance(out, Refusing) and jnp.allclose(out.array, x * 2)


def test_cond_on_a_concrete_array_still_joins():
    # Eagerly, the predicate is a concrete array: a run-time value, with which
    # another call could take the other branch. The branches must join, as when
    # the predicate is traced.
    with pytest.raises(quax.JoinError, match="output 0 of a cond"):
        quax.quaxify(_known_branches)(Refusing(x))


def test_cond_known_at_trace_time_joins_weak_types():
    # The chosen branch gives a weakly typed scalar, the other a float32: as JAX
    # joins them, the output is not weakly typed.
    def f(a):
        out = lax.cond(True, lambda b: (b, 1.0), lambda b: (b, jnp.float32(2)), a)
        return out[1]

    expected = jax.jit(f)(x)
    out = jax.jit(quax.quaxify(f))(Refusing(x))
    assert not jax.typeof(out).weak_type and not jax.typeof(expected).weak_type
    assert out == expected


def test_jit_keeps_name_and_donation():
    @jax.jit
    def inner(b):
        return b * 2

    g = jax.jit(
        lambda a: (
            quax.quaxify(
                # A jitted function has `__wrapped__` (`functools.wraps`); JAX's
                # annotations leave it out.
                lambda b: jax.jit(inner.__wrapped__, donate_argnums=0)(b)  # pyright: ignore[reportAttributeAccessIssue]
            )(Dense(a)).array
        )
    )
    text = g.lower(x).as_text()
    assert text is not None
    assert "inner" in str(jax.make_jaxpr(quax.quaxify(inner))(Dense(x)))
    assert text


def test_inline_jit_is_staged_as_jax_stages_it():
    # An inlined `jit` (every `jax.numpy` function) leaves its equations in the
    # caller; one with shardings stays a `jit` (and from JAX 0.11 `inline=True` keeps
    # the call for lowering to inline): the same equations as without quax.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    programs = [
        lambda a: jnp.sin(a) * 2,
        lambda a: jax.jit(lambda b: jnp.sin(b) * 2, inline=True)(a),
        lambda a: jax.jit(lambda b: b * 2, inline=True, in_shardings=device)(a),
    ]
    for program in programs:
        jaxpr = jax.make_jaxpr(quax.quaxify(program))(Refusing(x))
        expected = jax.make_jaxpr(program)(x)
        assert [e.primitive.name for e in jaxpr.eqns] == [
            e.primitive.name for e in expected.eqns
        ]
        out = quax.quaxify(program)(Refusing(x))
        assert isinstance(out, Refusing) and jnp.allclose(out.array, program(x))
    assert [e.primitive.name for e in jaxpr.eqns] == ["jit"]


def test_jit_cache_hits():
    count = 0

    @jax.jit
    def inner(b):
        nonlocal count
        count += 1
        return jnp.sin(b)

    f = quax.quaxify(lambda a: inner(a))
    f(Refusing(x))
    f(Refusing(x))
    assert count == 1


class NeedsConstant(Dense):
    """A `Dense` whose `pow` and `select_n` rules need their plain operands' values,
    like a units family's (an exponent, a constant of NaNs)."""


@quax.register(lax.pow_p)
def _(a: NeedsConstant, y: jax.typing.ArrayLike) -> NeedsConstant:
    assert not isinstance(y, jax.core.Tracer), "exponent only known at run time"
    return NeedsConstant(lax.pow(a.array, y))


@quax.register(lax.select_n_p)
def _(which: jax.typing.ArrayLike, *cases: jax.typing.ArrayLike | NeedsConstant):
    for c in cases:
        assert isinstance(c, NeedsConstant) or not isinstance(c, jax.core.Tracer)
    return NeedsConstant(lax.select_n(which, *dense(list(cases))))


@pytest.mark.parametrize("jit", [False, True])
def test_constants_stay_constants(jit):
    # Under an enclosing `jit`, constants passed to or computed in a nested
    # (inline) jit reach the rules as numbers, as they would without it.
    g = lambda a: jax.jit(lambda b, e: b**e)(a, 1.5)
    run = (lambda h: jax.jit(quax.quaxify(h))) if jit else quax.quaxify
    p, w = run(lambda a: (a**1.5, jnp.where(x > 1, a, jnp.nan)))(NeedsConstant(x))
    assert jnp.allclose(p.array, x**1.5)
    assert jnp.allclose(w.array, jnp.where(x > 1, x, jnp.nan), equal_nan=True)
    assert jnp.allclose(run(g)(NeedsConstant(x)).array, x**1.5)


def test_nested_jit_constants_cached():
    count = 0

    def inner(b, e):
        nonlocal count
        count += 1
        return b**e

    f = quax.quaxify(lambda a, e: jax.jit(inner)(a, e))
    f(NeedsConstant(x), 1.5)
    f(NeedsConstant(x), 1.5)
    # Another constant re-evaluates the same jaxpr under quax, not `inner`.
    assert jnp.allclose(f(NeedsConstant(x), 2.5).array, x**2.5)
    assert count == 1


# Decisions on values, and vmap of a loop with a batched bound -------------------------


def test_while_with_batched_bound_under_vmap_inside_quaxify():
    def f(a, b, c):
        return lax.while_loop(lambda a: (a < c).squeeze(), lambda a: a + b, a)

    a, b = jnp.array([0.0]), jnp.array([1.5])
    c = jnp.array([0.0, 1.0, 2.0, 4.0, 4.5, 7.0])[:, None]
    batched = jax.vmap(f, in_axes=(None, None, 0))
    out = quax.quaxify(batched)(Dense(a), Dense(b), Dense(c))
    assert isinstance(out, Dense)
    # Each loop adds 1.5 until it reaches its own bound.
    np.testing.assert_allclose(out.array[:, 0], [0.0, 1.5, 3.0, 4.5, 4.5, 7.5])


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: lax.switch(jnp.argmax(a), [jnp.sin, jnp.cos, jnp.tanh], a),
        lambda a: lax.cond(jnp.sum(a) > 0, jnp.sin, jnp.cos, a),
    ],
    ids=["switch", "cond"],
)
def test_branch_on_a_refusing_value_names_the_primitive(fn):
    # (`jax.scipy.linalg.expm` picks its Pade order this way.) A wrapper that
    # refuses to materialise the index is told where and what to do.
    with pytest.raises(
        RuntimeError, match=r"(?s)index of a `cond`/`switch`.*Refusing"
    ) as e:
        quax.quaxify(fn)(Wrapper(jnp.array([0.5, 2.0, 1.0])))
    assert "enable_materialise" in str(e.value)


class _NonLinearWrapper(Wrapper):
    # A `Wrapper`'s predicate is read from its one boolean leaf (see
    # test_clients_compat.py); this one's leaf may not stand for its array.
    linear_in_leaves = False


def test_while_on_a_refusing_predicate_names_the_primitive():
    def f(a):
        return lax.while_loop(lambda a: jnp.sum(a) < 10.0, lambda a: a + 1.0, a)

    with pytest.raises(
        RuntimeError, match=r"(?s)predicate of a `while_loop`.*Refusing"
    ):
        quax.quaxify(f)(_NonLinearWrapper(jnp.ones(2)))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: lax.scan(lambda c, xi: (c + xi, xi), jnp.zeros(()), a)[0],
        lambda a: jax.pure_callback(
            lambda v: v, jax.ShapeDtypeStruct(a.shape, a.dtype), a
        ),
    ],
    ids=["join", "callback"],
)
def test_refusals_keep_the_runtime_error_contract(fn):
    # The core's explanation is added, but the error stays a RuntimeError with the
    # value's own text, chained to the value's error.
    with pytest.raises(RuntimeError, match="Refusing values never materialise") as e:
        quax.quaxify(fn)(Refusing(x))
    assert isinstance(e.value.__cause__, RefusedMaterialisation)
