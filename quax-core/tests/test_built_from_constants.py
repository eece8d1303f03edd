"""A value built from constants inside a quaxified function, passed into a loop as its
carry (or `xs`), whose body builds a new value.

JAX flattens the carry, so the body gets the value rebuilt around its own tracers and
must give it back with the same structure. The body's operators staged such a value
(see `quax._dispatch._staged`), which gave a plain array for the carry, and JAX
refused the loop ("carry input and carry output must have the same pytree
structure"); now they dispatch on it in the body, as on the same pytree outside any
quax trace (`quax._transform._quaxify._rebuilt_in_a_body`).

`Metres` is a unit-like test value: its rules keep its type (a sum of two, a product
with a plain array), so that it can be a loop's carry, and it never materialises, so
a passing test proves the rules ran. Each result is compared with the same program
unrolled in Python under quax, and with plain JAX on the dense arrays.
"""

import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.core import ShapedArray
from jaxtyping import Array, ArrayLike

from .test_nesting import T, Tagged


class Metres(quax.ArrayValue):
    """An array of lengths in metres: sums of two lengths and products with plain
    arrays are lengths, comparisons of two lengths are plain booleans."""

    array: Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> Array:
        raise RuntimeError("Refusing to materialise `Metres`")

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        # Broadcasts, conversions, slices: leaf-wise, still in metres.
        arrays = [v.array if isinstance(v, Metres) else v for v in values]
        out = primitive.bind(*arrays, **params)
        if primitive.multiple_results:
            return [Metres(o) for o in out]
        return Metres(out)

    __add__ = quax.quaxify(operator.add)
    __mul__ = quax.quaxify(operator.mul)
    __rmul__ = quax.quaxify(lambda a, b: b * a)
    __lt__ = quax.quaxify(operator.lt)


@quax.register(lax.add_p)
def _add(x: Metres, y: Metres, **params: Any) -> Metres:
    return Metres(lax.add(x.array, y.array, **params))


@quax.register(lax.add_p)
def _add_plain(x: Metres, y: ArrayLike, **params: Any) -> Metres:
    del x, y, params
    raise TypeError("a length plus a plain number")


@quax.register(lax.mul_p)
def _mul(x: Metres, y: ArrayLike, **params: Any) -> Metres:
    return Metres(lax.mul(x.array, y, **params))


@quax.register(lax.mul_p)
def _rmul(x: ArrayLike, y: Metres, **params: Any) -> Metres:
    return Metres(lax.mul(x, y.array, **params))


@quax.register(lax.lt_p)
def _lt(x: Metres, y: Metres, **params: Any) -> Array:
    return lax.lt(x.array, y.array, **params)


def _metres(x: Any) -> Any:
    return Metres(jnp.asarray(x, jnp.float32))


# Each program takes `x` (metres) and the constructor `V` of the values it builds from
# constants: `Metres` under quax, `jnp.asarray` for plain JAX on the dense arrays.
Program = Callable[[Any, Callable[[Any], Any]], Any]


def _fori(x: Any, V: Callable[[Any], Any]) -> Any:
    # The program: 1 -> 3 -> 7 -> 15.
    c = lax.fori_loop(0, 3, lambda i, c: c * 2.0 + V(jnp.ones(3)), V(jnp.ones(3)))
    return c + x


def _fori_unrolled(x: Any, V: Callable[[Any], Any]) -> Any:
    c = V(jnp.ones(3))
    for _ in range(3):
        c = c * 2.0 + V(jnp.ones(3))
    return c + x


def _scan(x: Any, V: Callable[[Any], Any]) -> Any:
    # Carry and `xs` built from constants; the stacked output is a value too.
    xs = V(jnp.arange(6.0).reshape(2, 3))
    c, ys = lax.scan(lambda c, r: (c * 2.0 + r, c + r), V(jnp.ones(3)), xs)
    return c + x, ys


def _scan_unrolled(x: Any, V: Callable[[Any], Any]) -> Any:
    xs = jnp.arange(6.0).reshape(2, 3)
    c, ys = V(jnp.ones(3)), []
    for r in (V(xs[0]), V(xs[1])):
        c, y = c * 2.0 + r, c + r
        ys.append(y)
    return c + x, ys


def _scan_some_steps(x: Any, V: Callable[[Any], Any]) -> Any:
    # The body builds a value only on the steps that `cond` takes.
    def body(c: Any, take: Any) -> Any:
        return lax.cond(take, lambda c: c + V(jnp.full(3, 10.0)), lambda c: c, c), None

    c, _ = lax.scan(body, V(jnp.ones(3)), jnp.array([True, False, True]))
    return c + x


def _scan_some_steps_unrolled(x: Any, V: Callable[[Any], Any]) -> Any:
    c = V(jnp.ones(3))
    for take in (True, False, True):
        c = c + V(jnp.full(3, 10.0)) if take else c
    return c + x


def _while(x: Any, V: Callable[[Any], Any]) -> Any:
    # `cond_fun` compares the value with another built from constants.
    c = lax.while_loop(
        lambda c: jnp.all(c < V(jnp.full(3, 20.0))),
        lambda c: c * 2.0 + V(jnp.ones(3)),
        V(jnp.ones(3)),
    )
    return c + x


def _while_unrolled(x: Any, V: Callable[[Any], Any]) -> Any:
    c = V(jnp.ones(3))
    for _ in range(4):  # 1 -> 3 -> 7 -> 15 -> 31, the first not below 20
        c = c * 2.0 + V(jnp.ones(3))
    return c + x


def _switch_in_loop(x: Any, V: Callable[[Any], Any]) -> Any:
    # Each branch gives the carry back as a value built in it.
    branches = [lambda c: c * 2.0, lambda c: c + V(jnp.ones(3))]
    body = lambda i, c: lax.switch(i % 2, branches, c)
    return lax.fori_loop(0, 4, body, V(jnp.ones(3))) + x


def _switch_in_loop_unrolled(x: Any, V: Callable[[Any], Any]) -> Any:
    c = V(jnp.ones(3))
    for i in range(4):
        c = c * 2.0 if i % 2 == 0 else c + V(jnp.ones(3))
    return c + x


PROGRAMS: dict[str, tuple[Program, Program]] = {
    "fori_loop": (_fori, _fori_unrolled),
    "scan": (_scan, _scan_unrolled),
    "scan_cond_some_steps": (_scan_some_steps, _scan_some_steps_unrolled),
    "while_loop": (_while, _while_unrolled),
    "switch_in_fori_loop": (_switch_in_loop, _switch_in_loop_unrolled),
}

X = np.array([0.5, -1.0, 2.0], np.float32)


def _dense(name: str) -> Any:
    program, _ = PROGRAMS[name]
    return program(jnp.asarray(X), jnp.asarray)


def _check(got: Any, want: Any) -> None:
    """`got` holds `Metres` where `want` holds arrays, with the same numbers."""
    got_leaves = jax.tree.leaves(got, is_leaf=quax.is_value)
    want_leaves = jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), (got, want)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert type(g) is Metres, g
        assert not isinstance(g.array, quax.Value), g
        np.testing.assert_allclose(g.array, w, rtol=1e-6)


@pytest.mark.parametrize("caching", [True, False], ids=["caches-on", "caches-off"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_loop_carry_built_from_constants(name: str, caching: bool) -> None:
    program, unrolled = PROGRAMS[name]
    want = _dense(name)
    f = lambda x: program(x, Metres)
    with quax.caching(caching):
        for _ in range(2):
            _check(quax.quaxify(f)(_metres(X)), want)
        # The same program with the loop unrolled in Python, under quax.
        unrolled_out = quax.quaxify(lambda x: unrolled(x, Metres))(_metres(X))
        _check(unrolled_out if name != "scan" else _stacked_scan(unrolled_out), want)
        staged = jax.jit(quax.quaxify(f))
        _check(staged(_metres(X)), want)
        _check(staged(_metres(X)), want)
        _check(quax.quaxify(jax.jit(f))(_metres(X)), want)


def _stacked_scan(out: Any) -> Any:
    c, ys = out
    return c, Metres(jnp.stack([y.array for y in ys]))


def test_loop_carry_built_from_constants_in_verify_mode(verifying: None) -> None:
    del verifying
    for name, (program, _) in PROGRAMS.items():
        want = _dense(name)
        f = quax.quaxify(lambda x, program=program: program(x, Metres))
        _check(f(_metres(X)), want)
        _check(f(_metres(X)), want)


_TRANSFORMS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "vmap_outside": lambda f: jax.vmap(quax.quaxify(f)),
    "vmap_inside": lambda f: quax.quaxify(jax.vmap(f)),
    "jit_vmap_outside": lambda f: jax.jit(jax.vmap(quax.quaxify(f))),
}


@pytest.mark.parametrize("transform", list(_TRANSFORMS))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_loop_carry_built_from_constants_batched(name: str, transform: str) -> None:
    program, _ = PROGRAMS[name]
    xs = np.stack([X, 2 * X])
    want = jax.vmap(lambda x: program(x, jnp.asarray))(jnp.asarray(xs))
    got = _TRANSFORMS[transform](lambda x: program(x, Metres))(_metres(xs))
    _check(got, want)


def test_loop_carry_built_from_constants_differentiated() -> None:
    # c_1 = s + 1, c_2 = s^2 + s + 1, c_3 = s^3 + s^2 + s + 1; d c_3 / ds at s = 2
    # is 3 s^2 + 2 s + 1 = 17 for each of the 3 elements.
    def looped(s: Any, V: Callable[[Any], Any]) -> Any:
        return lax.fori_loop(0, 3, lambda i, c: c * s + V(jnp.ones(3)), V(jnp.ones(3)))

    def loss(s: Any) -> Any:
        out = quax.quaxify(lambda x: looped(s, Metres) + x)(_metres(X))
        assert type(out) is Metres, out
        return jnp.sum(out.array)

    dense = jax.grad(lambda s: jnp.sum(looped(s, jnp.asarray) + X))(2.0)
    np.testing.assert_allclose(dense, 51.0, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(loss)(2.0), dense, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(2.0), dense, rtol=1e-6)


class Diag(quax.ArrayValue):
    """A diagonal matrix from its diagonal: its aval is not its leaf's, so a batch of
    them is not the value of the batched leaf."""

    diag: Array

    def aval(self) -> Any:
        n = self.diag.shape[-1]
        return ShapedArray((n, n), self.diag.dtype)

    def materialise(self) -> Array:
        raise RuntimeError("Refusing to materialise `Diag`")

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        raise NotImplementedError(primitive)

    __mul__ = quax.quaxify(operator.mul)


@quax.register(lax.mul_p)
def _diag_mul(x: Diag, y: ArrayLike, **params: Any) -> Diag:
    return Diag(lax.mul(x.diag, y, **params))


def test_value_of_batched_leaves_is_still_staged() -> None:
    # Only the tracers of a staged body are dispatched on there: a value built in a
    # `vmap` from its batched tracers is staged, and the quax trace refuses a type
    # that does not batch leaf by leaf. Dispatched on per example, the `vmap` would
    # return one `Diag` of the batched leaf, a (3, 3) matrix for three 2 x 2 ones.
    def f(x: Any) -> Any:
        return jax.vmap(lambda d: Diag(d) * 2.0)(jnp.ones((3, 2))), x

    with pytest.raises(ValueError, match="does not batch leaf by leaf"):
        quax.quaxify(f)(_metres(X))


def test_value_meeting_a_traced_input_in_a_body_is_still_staged() -> None:
    # A value built from constants crosses into `cond` as a pytree and meets the
    # traced input there (closed over, a tracer of the quax trace): it is staged, so
    # that the rule sees the input's type (`Tagged`'s product names both tags: `c*t`).
    # Dispatched on in the body, the rule took the input for a plain array (`c*1`).
    def f(t: Any) -> Any:
        c = Tagged(jnp.array([3.0, 4.0]), "c")
        return lax.cond(t.shape[0] == 2, lambda c: c * t, lambda c: c * t, c)

    for run in (quax.quaxify(f), jax.jit(quax.quaxify(f))):
        out = run(T)
        assert type(out) is Tagged, out
        assert out.tag == "c*t"
        np.testing.assert_allclose(out.array, np.array([3.0, 8.0]), rtol=1e-6)
