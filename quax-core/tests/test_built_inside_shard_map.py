"""Values built inside a `shard_map` body (or a custom derivative's function) that
JAX traces below a quaxified function's trace, through `jit`, `vmap`, `grad`, `cond`,
`scan` or `while_loop`, join the quax trace (see `quax._rules._custom`).

JAX traces these bodies while their primitive binds, with the eval trace current; the
body's trace then had the eval trace as its parent, so a value built in it missed
the quax trace: its operator ran in a quax trace of its own and gave a value of
values (`Tagged(Tagged(.., '1*t'), 'c*1')`) where plain JAX on the dense arrays
gives one product. Every program here builds fresh functions, so that JAX's tracing
caches cannot answer from a run of another program.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P
from quax._compat import BODY_TRACING_METHODS, DynamicJaxprTrace

from .test_nesting import T, Tagged


_MESH = Mesh(np.array(jax.devices()[:1]), ("i",))
_DENSE = np.array([1.0, 2.0], np.float32)  # `T`'s array
_CLOSED = Tagged(jnp.float32(2.0), "c")  # closed over by a `shard_map` body


def _shard_map(f: Callable[..., Any]) -> Callable[..., Any]:
    return jax.shard_map(f, mesh=_MESH, in_specs=P(), out_specs=P())


def _build(c: Any) -> Any:
    return Tagged(2.0, "c") * c


def _assert_tagged(r: Any, tag: str, expected: Any) -> None:
    assert type(r) is Tagged, r
    assert not isinstance(r.array, quax.Value), r
    assert r.tag == tag
    np.testing.assert_allclose(r.array, expected, rtol=1e-6)


@jax.custom_jvp
def _custom_jvp(c: Any) -> Any:
    return _build(c)


_custom_jvp.defjvp(lambda primals, tangents: (_custom_jvp(*primals), tangents[0]))


@jax.custom_vjp
def _custom_vjp(c: Any) -> Any:
    return _build(c)


_custom_vjp.defvjp(lambda c: (_custom_vjp(c), None), lambda _, ct: (ct,))


# Each builds a fresh program of `t` (the quaxified function's input `T`), which
# multiplies `Tagged(2., "c")` built inside with `t`: `2 * T` tagged "c*t".
_PROGRAMS = {
    "jit-of-shard_map": lambda: (
        lambda t: jax.jit(lambda s: _shard_map(lambda c: _build(c))(s))(t)
    ),
    "shard_map-of-jit": lambda: lambda t: _shard_map(jax.jit(lambda c: _build(c)))(t),
    "jit-of-shard_map-of-jit": lambda: (
        lambda t: jax.jit(_shard_map(jax.jit(lambda c: _build(c))))(t)
    ),
    "vmap-of-shard_map": lambda: lambda t: jax.vmap(_shard_map(lambda c: _build(c)))(t),
    "jit-of-vmap-of-shard_map": lambda: (
        lambda t: jax.jit(jax.vmap(_shard_map(lambda c: _build(c))))(t)
    ),
    "shard_map-of-vmap": lambda: lambda t: _shard_map(jax.vmap(lambda c: _build(c)))(t),
    "cond-in-shard_map": lambda: (
        lambda t: jax.jit(
            _shard_map(
                lambda c: lax.cond(True, lambda d: _build(d), lambda d: _build(d), c)
            )
        )(t)
    ),
    "scan-in-shard_map": lambda: (
        lambda t: jax.jit(
            _shard_map(
                lambda c: lax.scan(lambda k, _: (k, None), _build(c), None, length=2)[0]
            )
        )(t)
    ),
    "while-in-shard_map": lambda: (
        lambda t: jax.jit(
            _shard_map(
                lambda c: lax.while_loop(
                    lambda kn: kn[1] < 2, lambda kn: (kn[0], kn[1] + 1), (_build(c), 0)
                )[0]
            )
        )(t)
    ),
    "closed-over": lambda: lambda t: jax.jit(_shard_map(lambda c: _CLOSED * c))(t),
    "returned-from-the-body": lambda: (
        lambda t: (
            jax.jit(
                _shard_map(lambda c: (Tagged(jnp.full(2, 2.0, jnp.float32), "c"), c))
            )(t)[0]
            * t
        )
    ),
    "jit-of-custom_jvp": lambda: lambda t: jax.jit(lambda c: _custom_jvp(c))(t),
    "jit-of-custom_vjp": lambda: lambda t: jax.jit(lambda c: _custom_vjp(c))(t),
}


@pytest.mark.parametrize("caching", [True, False], ids=["caches-on", "caches-off"])
@pytest.mark.parametrize("program", list(_PROGRAMS), ids=list(_PROGRAMS))
def test_value_built_inside_shard_map(program: str, caching: bool) -> None:
    with quax.caching(caching):
        _assert_tagged(quax.quaxify(_PROGRAMS[program]())(T), "c*t", 2.0 * _DENSE)
        # The same program staged whole, and run again (from the caches, when on).
        staged = jax.jit(quax.quaxify(_PROGRAMS[program]()))
        _assert_tagged(staged(T), "c*t", 2.0 * _DENSE)
        _assert_tagged(staged(T), "c*t", 2.0 * _DENSE)


def test_value_built_inside_shard_map_in_verify_mode(verifying: None) -> None:
    del verifying
    for make in _PROGRAMS.values():
        program = make()
        _assert_tagged(quax.quaxify(program)(T), "c*t", 2.0 * _DENSE)
        _assert_tagged(quax.quaxify(program)(T), "c*t", 2.0 * _DENSE)


def test_value_built_inside_shard_map_under_grad() -> None:
    # d/dx sum(x * 2 * T) = sum(2 * T), with the product's tags.
    expected = jax.grad(lambda x: jnp.sum(x * 2.0 * _DENSE))(3.0)
    build = lambda c: _build(c)
    outside = lambda t: jax.grad(lambda x: jnp.sum(x * jax.jit(_shard_map(build))(t)))(
        3.0
    )
    _assert_tagged(quax.quaxify(outside)(T), "1*c*t", expected)
    inside = lambda t: jax.jit(
        _shard_map(lambda c: jax.grad(lambda x: jnp.sum(x * _build(c)))(3.0))
    )(t)
    _assert_tagged(quax.quaxify(inside)(T), "1*c*t", expected)


@jax.custom_jvp
def _plain_custom_jvp(x: Any) -> Any:
    return jnp.sin(x)


_plain_custom_jvp.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


def test_plain_programs_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    # Outside quax, the bodies' traces nesting in the staging trace changes neither
    # the jaxprs (compared with JAX's own methods) nor the results.
    plain = {
        "shard_map": lambda x: _shard_map(lambda c: jnp.sin(c) * 2.0)(x),
        "grad-of-shard_map": jax.grad(lambda x: jnp.sum(_shard_map(jnp.sin)(x))),
        "custom_jvp": lambda x: _plain_custom_jvp(x) * 2.0,
        "grad-of-custom_jvp": jax.grad(lambda x: jnp.sum(_plain_custom_jvp(x))),
    }
    expected = {
        "shard_map": np.sin(_DENSE) * 2.0,
        "grad-of-shard_map": np.cos(_DENSE),
        "custom_jvp": np.sin(_DENSE) * 2.0,
        "grad-of-custom_jvp": np.cos(_DENSE),
    }
    jaxprs = {}
    for name, f in plain.items():
        np.testing.assert_allclose(jax.jit(f)(_DENSE), expected[name], rtol=1e-6)
        jaxprs[name] = str(jax.make_jaxpr(f)(_DENSE))
    for name in BODY_TRACING_METHODS:
        monkeypatch.setattr(
            DynamicJaxprTrace, name, getattr(DynamicJaxprTrace, name).__wrapped__
        )
    for name, f in plain.items():
        assert str(jax.make_jaxpr(f)(_DENSE)) == jaxprs[name], name
