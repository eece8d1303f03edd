"""Derivatives through complex quantities: `real`, `imag`, `conj`, `complex`, `abs`,
`angle`/`atan2`, `mul`/`div` of complex quantities, `jnp.linalg.norm` of a complex
vector and `exp` of an imaginary dimensionless quantity, under `jax.jvp`,
`jax.grad` (of a real-valued sum, and with `holomorphic=True`), `jax.vjp` with a
complex cotangent, `jax.jacfwd`/`jacrev`, inside and outside `quax.quaxify`.

Each is compared with the same computation in plain JAX on the SI numbers (volts,
amperes, metres, radians). Transposing `real` and `imag` (reverse mode through any
complex quantity) binds `complex` of a plain zero and a quantity cotangent: before
quax-units had a rule for `complex`, every reverse-mode case below through `real`,
`imag`, `angle` or `norm` raised a `UnitsMaterialisationError`. JAX's derivative of
`abs` of a complex number divides by `where(|z| == 0, 1, |z|)`, a plain 1 beside a
quantity: inside `quax.quaxify` it is refused with a message naming the ways out,
which are tested here too.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_units
from jax import lax
from quax_units import Quantity, UnitError, ustrip
from quax_units._units import si_unit


def _is_quantity(x: Any) -> bool:
    return isinstance(x, Quantity)


def _si(x: Any) -> Any:
    """The SI numbers of the quantities in `x` (plain arrays as they are)."""
    return jax.tree.map(
        lambda v: np.asarray(v.array if _is_quantity(v) else v), x, is_leaf=_is_quantity
    )


def _assert_close(got: Any, want: Any) -> None:
    got_leaves, want_leaves = jax.tree.leaves(_si(got)), jax.tree.leaves(_si(want))
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _is_number(x: Any) -> bool:
    """Whether `x` is a plain array or a dimensionless quantity."""
    return not _is_quantity(x) or x.units.is_dimensionless


# The SI numbers, and the quantities holding them in other units.
z = jnp.array([1.0 + 0.5j, -2.0 + 3.0j], jnp.complex64)  # volts
w = jnp.array([0.5 - 1.0j, 2.0 + 0.25j], jnp.complex64)  # amperes
x = jnp.array([1.0, -2.0])  # metres
y = jnp.array([0.5, 3.0])  # metres
phi = jnp.array([0.3, -1.2])  # radians
zq = Quantity(z * 1e3, "mV")
wq = Quantity(w * 1e3, "mA")
xq = Quantity(x, "m")
yq = Quantity(y * 1e-3, "km")
phiq = Quantity(phi * 180 / np.pi, "deg")
dz = jnp.array([0.3 - 0.2j, 0.1 + 1.0j], jnp.complex64)  # tangents, SI numbers
dw = jnp.array([-0.4 + 0.1j, 0.2 - 0.3j], jnp.complex64)
dx = jnp.array([0.7, -0.1])
dy = jnp.array([0.2, 0.4])


def _tangent(a: Any) -> Any:
    """A tangent of `a`'s SI numbers (plain)."""
    for value, tangent in [(z, dz), (w, dw), (x, dx), (y, dy), (phi, dy)]:
        if a is value:
            return tangent
    raise AssertionError


# Real-valued functions: name -> (function, quantity arguments, SI arguments). Each
# is a real scalar (`jnp.sum` of a real array, or a norm), for `grad`.
_REAL: dict[str, tuple[Callable[..., Any], tuple[Any, ...], tuple[Any, ...]]] = {
    "real": (lambda z: jnp.sum(jnp.real(z) ** 2), (zq,), (z,)),
    "imag": (lambda z: jnp.sum(jnp.imag(z) * jnp.real(z)), (zq,), (z,)),
    "conj": (lambda z, w: jnp.sum(jnp.real(jnp.conj(z) * w)), (zq, wq), (z, w)),
    "complex": (
        lambda x, y: jnp.sum(jnp.imag(lax.complex(x, y) ** 2)),
        (xq, yq),
        (x, y),
    ),
    "angle": (lambda z: jnp.sum(jnp.angle(z) ** 2), (zq,), (z,)),
    "angle in deg": (lambda z: jnp.sum(jnp.angle(z, deg=True)), (zq,), (z,)),
    "atan2": (lambda x, y: jnp.sum(jnp.arctan2(y, x)), (xq, yq), (x, y)),
    "mul": (lambda z, w: jnp.sum(jnp.imag(z * w)), (zq, wq), (z, w)),
    "div": (lambda z, w: jnp.sum(jnp.real(z / w)), (zq, wq), (z, w)),
    "norm": (lambda z: jnp.linalg.norm(z), (zq,), (z,)),
    "exp of an imaginary angle": (
        lambda p: jnp.sum(jnp.real(jnp.exp(1j * p)) - jnp.imag(jnp.exp(2j * p))),
        (phiq,),
        (phi,),
    ),
}

# The dense reference for the angle in `deg`: the rule shows the same angle, whose
# SI number is in radians.
_DENSE = {"angle in deg": lambda z: jnp.sum(jnp.angle(z))}


def _dense(name: str) -> Callable[..., Any]:
    return _DENSE.get(name, _REAL[name][0])


def _argnums(args: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(range(len(args)))


@pytest.mark.parametrize("name", list(_REAL))
def test_grad_inside_quaxify(name: str) -> None:
    f, args, dense_args = _REAL[name]
    n = _argnums(args)
    _assert_close(
        quax.quaxify(jax.grad(f, argnums=n))(*args),
        jax.grad(_dense(name), argnums=n)(*dense_args),
    )


@pytest.mark.parametrize("name", list(_REAL))
def test_vjp_inside_quaxify(name: str) -> None:
    f, args, dense_args = _REAL[name]
    seed = jnp.float32(1.5)
    _assert_close(
        quax.quaxify(lambda *a: jax.vjp(f, *a)[1](seed))(*args),
        jax.vjp(_dense(name), *dense_args)[1](seed),
    )


@pytest.mark.parametrize("name", list(_REAL))
def test_jvp_inside_quaxify_with_quantity_tangents(name: str) -> None:
    # Tangents in their inputs' units (so inputs of different units may be
    # differentiated together): their SI numbers are the dense tangents.
    f, args, dense_args = _REAL[name]
    tangents = tuple(_tangent(a) for a in dense_args)
    quantities = tuple(
        Quantity(t, si_unit(a.units)) for t, a in zip(tangents, args, strict=True)
    )
    _assert_close(
        quax.quaxify(lambda a, t: jax.jvp(f, a, t))(args, quantities),
        jax.jvp(_dense(name), dense_args, tangents),
    )


@pytest.mark.parametrize("name", [k for k, v in _REAL.items() if len(v[1]) == 1])
def test_jvp_inside_quaxify_with_a_plain_tangent(name: str) -> None:
    # A plain tangent counts per unit of its input: the output's tangent is in units
    # of output over input (its SI numbers are the dense ones).
    f, args, dense_args = _REAL[name]
    tangents = tuple(_tangent(a) for a in dense_args)
    _assert_close(
        quax.quaxify(lambda *a: jax.jvp(f, a, tangents))(*args),
        jax.jvp(_dense(name), dense_args, tangents),
    )


@pytest.mark.parametrize("name", list(_REAL))
def test_derivatives_outside_quaxify(name: str) -> None:
    f, args, dense_args = _REAL[name]
    n = _argnums(args)
    want = jax.grad(_dense(name), argnums=n)(*dense_args)
    # `quax_units.grad` gives the units of output over input.
    _assert_close(quax_units.grad(quax.quaxify(f), argnums=n)(*args), want)

    # `jax.grad` outside labels the gradient with the input's units (see the
    # README), but its numbers are the dense ones.
    def stripped(*a: Any) -> Any:
        out = quax.quaxify(f)(*a)
        return ustrip(si_unit(out.units), out) if _is_quantity(out) else out

    _assert_close(jax.grad(stripped, argnums=n)(*args), want)
    # `jax.jvp` outside: tangents of the inputs' structure, in their units.
    tangents = tuple(_tangent(a) for a in dense_args)
    quantities = tuple(
        Quantity(t, si_unit(a.units)) for t, a in zip(tangents, args, strict=True)
    )
    _assert_close(
        jax.jvp(quax.quaxify(f), args, quantities),
        jax.jvp(_dense(name), dense_args, tangents),
    )


def test_the_units_of_the_gradients() -> None:
    # d f / d input is in the output's units over the input's.
    grad_z, grad_w = quax.quaxify(jax.grad(_REAL["mul"][0], argnums=(0, 1)))(zq, wq)
    assert grad_z.units == wq.units and grad_w.units == zq.units
    (grad_angle,) = quax.quaxify(jax.grad(_REAL["angle"][0], argnums=(0,)))(zq)
    assert grad_angle.units == zq.units**-1
    # `norm` of a vector in volts: the gradient is a plain number per volt.
    assert _is_number(quax.quaxify(jax.grad(jnp.linalg.norm))(zq))
    grad_x, grad_y = quax.quaxify(jax.grad(_REAL["complex"][0], argnums=(0, 1)))(xq, yq)
    assert grad_x.units == grad_y.units == xq.units
    # A function of an angle in `deg`: a number per radian.
    assert _is_number(
        quax.quaxify(jax.grad(_REAL["exp of an imaginary angle"][0]))(phiq)
    )


def test_grad_under_jit() -> None:
    for name in ["imag", "angle", "norm", "complex"]:
        f, args, dense_args = _REAL[name]
        n = _argnums(args)
        _assert_close(
            jax.jit(quax.quaxify(jax.grad(f, argnums=n)))(*args),
            jax.grad(_dense(name), argnums=n)(*dense_args),
        )


# Holomorphic functions of `z` (complex output): name -> (function of quantities,
# function of the SI numbers).
_w0 = Quantity(jnp.complex64(2.0 + 1.0j), "V")
_HOLOMORPHIC: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "mul": (lambda z: z * wq, lambda z: z * w),
    "square": (lambda z: z**2, lambda z: z**2),
    "div": (lambda z: z / wq, lambda z: z / w),
    "exp of a ratio": (
        lambda z: jnp.exp(z / _w0),
        lambda z: jnp.exp(z / jnp.complex64(2.0 + 1.0j)),
    ),
}


@pytest.mark.parametrize("name", list(_HOLOMORPHIC))
def test_holomorphic_derivatives_inside_quaxify(name: str) -> None:
    f, f_dense = _HOLOMORPHIC[name]
    _assert_close(
        quax.quaxify(jax.grad(lambda z: jnp.sum(f(z)), holomorphic=True))(zq),
        jax.grad(lambda z: jnp.sum(f_dense(z)), holomorphic=True)(z),
    )
    for jacobian in [jax.jacfwd, jax.jacrev]:
        _assert_close(
            quax.quaxify(jacobian(f, holomorphic=True))(zq),
            jacobian(f_dense, holomorphic=True)(z),
        )


# Complex-valued functions for `vjp` with a complex cotangent (not all holomorphic).
_COMPLEX_OUT = dict(_HOLOMORPHIC)
_COMPLEX_OUT["conj"] = (lambda z: jnp.conj(z) * 2, lambda z: jnp.conj(z) * 2)
_COMPLEX_OUT["complex of the parts"] = (
    lambda z: lax.complex(jnp.imag(z), jnp.real(z)),
    lambda z: lax.complex(jnp.imag(z), jnp.real(z)),
)
_COMPLEX_OUT["times its phase"] = (
    lambda z: z * jnp.exp(1j * jnp.angle(z)),
    lambda z: z * jnp.exp(1j * jnp.angle(z)),
)


@pytest.mark.parametrize("name", list(_COMPLEX_OUT))
def test_vjp_with_a_complex_cotangent(name: str) -> None:
    f, f_dense = _COMPLEX_OUT[name]
    cotangent = jnp.array([1.0 - 0.5j, -0.25 + 2.0j], jnp.complex64)
    _assert_close(
        quax.quaxify(lambda z: jax.vjp(f, z)[1](cotangent))(zq),
        jax.vjp(f_dense, z)[1](cotangent),
    )
    # Outside `quaxify` the cotangent has the output's structure (its units); the
    # result is labelled with the input's (see the README), its numbers the dense.
    out, vjp = jax.vjp(quax.quaxify(f), zq)
    (got,) = vjp(Quantity(cotangent, si_unit(out.units)))
    _assert_close(got.array, jax.vjp(f_dense, z)[1](cotangent)[0])


def test_complex_of_two_quantities() -> None:
    # One dimension in two units: shown in the first operand's, on the SI numbers.
    out = quax.quaxify(lax.complex)(xq, yq)
    assert str(out.unit) == "m"
    np.testing.assert_allclose(ustrip("m", out), lax.complex(x, y))
    np.testing.assert_allclose(ustrip("cm", out), lax.complex(x, y) * 100)
    # A plain zero part fits any unit (as JAX's transposes of `real` and `imag`
    # bind it), a literal or an array of zeros.
    for zero in [0.0, jnp.zeros(2)]:
        got = quax.quaxify(lax.complex)(zero, yq)
        assert got.units == yq.units
        np.testing.assert_allclose(ustrip("m", got), lax.complex(jnp.zeros(2), y))
    # A plain part beside a dimensionless quantity is a number too.
    got = quax.quaxify(lax.complex)(Quantity(50.0, "%"), jnp.float32(2.0))
    assert got.units.is_dimensionless
    np.testing.assert_allclose(jnp.asarray(got), 0.5 + 2.0j)


def test_complex_refuses_parts_of_different_dimensions() -> None:
    way_out = r"Give both parts in one dimension \(`lax.complex\(x, Quantity\(y, unit"
    with pytest.raises(UnitError, match=r"`complex` needs operands .* m \[m\] and s"):
        quax.quaxify(lax.complex)(xq, Quantity(y, "s"))
    # A plain non-zero part beside a length: a number is not a length.
    with pytest.raises(UnitError, match=way_out):
        quax.quaxify(lax.complex)(xq, y)
    with pytest.raises(UnitError, match=way_out):
        quax.quaxify(lambda a: lax.complex(jnp.real(a), jnp.ones(2)))(zq)


_weights = jnp.array([1.0, -2.0, 0.5])


def _sum_abs(z: Any) -> Any:
    return jnp.sum(jnp.abs(z) * _weights)


def test_abs_of_a_complex_quantity() -> None:
    # The value, and its derivative where JAX differentiates the SI numbers.
    with_zero = Quantity(jnp.array([1.0 + 0.5j, 0.0j, -2.0 + 3.0j]) * 1e3, "mV")
    numbers = with_zero.array
    np.testing.assert_allclose(
        ustrip("V", quax.quaxify(_sum_abs)(with_zero)), _sum_abs(numbers), rtol=1e-6
    )
    want = jax.grad(_sum_abs)(numbers)
    _assert_close(quax_units.grad(quax.quaxify(_sum_abs))(with_zero), want)
    # Inside `quaxify`, JAX's derivative of `abs` selects a plain 1 beside `|z|`:
    # refused, naming the ways out.
    for derivative in [
        jax.grad(_sum_abs),
        lambda z: jax.jvp(_sum_abs, (z,), (jnp.ones_like(numbers),)),
        lambda z: jax.vjp(_sum_abs, z)[1](jnp.float32(1.0)),
    ]:
        with pytest.raises(UnitError, match=r"derivative of `jnp.abs` of a complex"):
            quax.quaxify(derivative)(with_zero)
    # The first way out: `abs` of a dimensionless ratio, the same numbers and
    # derivatives (also at 0).
    volt = Quantity(1.0, "V")

    def by_ratio(z: Any) -> Any:
        return jnp.sum(jnp.abs(z / volt) * volt * _weights)

    _assert_close(quax.quaxify(jax.grad(by_ratio))(with_zero), want)
    tangent = jnp.array([0.3 - 0.2j, 1.0j, 0.5 + 0.5j], jnp.complex64)
    _assert_close(
        quax.quaxify(lambda z: jax.jvp(by_ratio, (z,), (tangent,)))(with_zero),
        jax.jvp(_sum_abs, (numbers,), (tangent,)),
    )


def test_plain_tangents_of_inputs_in_different_units() -> None:
    # A plain tangent counts per unit of its input: `conj(z) w` with plain tangents
    # of `z` (in V) and `w` (in A) would add a part in A to one in V.
    f = _REAL["conj"][0]
    with pytest.raises(UnitError, match=r"pass the tangents as quantities"):
        quax.quaxify(lambda z, w: jax.jvp(f, (z, w), (dz, dw)))(zq, wq)
    # With `w` a plain array, the part from `w`'s plain tangent is in V and that
    # from `z`'s is a plain number (per volt): their sum was shown in V.
    with pytest.raises(UnitError, match=r"a plain part other than zeros beside"):
        quax.quaxify(lambda z, w: jax.jvp(f, (z, w), (dz, dw)))(zq, w)
    # A plain input's tangent beside a quantity tangent adds parts of one unit.
    got = quax.quaxify(lambda z, w, t: jax.jvp(f, (z, w), (t, dw)))(
        zq, w, Quantity(dz, "V")
    )
    _assert_close(got, jax.jvp(f, (z, w), (dz, dw)))
    assert got[1].units == zq.units


def _parts(z: Any) -> Any:
    # Real, imaginary parts and products of a complex quantity: reverse mode
    # transposes `real` and `imag` into `complex`.
    return jnp.sum(
        jnp.real(z) * jnp.imag(z) + jnp.real(z * jnp.conj(z)) + jnp.imag(z * z)
    )


_BODIES: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "vmap of grad": lambda f: jax.vmap(jax.grad(f)),
    "grad of vmap": lambda f: jax.grad(lambda z: jnp.sum(jax.vmap(f)(z))),
    "jacrev": jax.jacrev,
    "linearize": lambda f: lambda z: jax.linearize(f, z)[1](jnp.ones_like(z)),
    # A reverse-mode sum of gradients over the rows, in a `scan` body.
    "grad in a scan": lambda f: (
        lambda z: lax.scan(
            lambda carry, row: (carry + jax.grad(f)(row), None),
            jnp.zeros(z.shape[1:], z.dtype),
            z,
        )[0]
    ),
    "grad of a checkpoint": lambda f: jax.grad(jax.checkpoint(f)),
}


@pytest.mark.parametrize("name", list(_BODIES))
def test_reverse_mode_in_transformed_bodies(name: str) -> None:
    how = _BODIES[name]
    rows = jnp.stack([z, z * (0.5 - 2j)])  # volts
    _assert_close(
        quax.quaxify(how(_parts))(Quantity(rows * 1e3, "mV")), how(_parts)(rows)
    )


def test_second_derivatives_of_the_angle() -> None:
    # The `jvp` of `jnp.angle`'s rule is differentiated again: it divides by
    # `|z|^2` computed as `Re(z conj(z))` (with `jnp.abs`, whose derivative is
    # refused inside `quaxify`, this raised a `UnitError`).
    def slope(z: Any) -> Any:
        gradient = jax.grad(lambda z: jnp.sum(jnp.angle(z)))(z)
        return jnp.sum(jnp.real(gradient) + jnp.imag(gradient))

    _assert_close(quax.quaxify(jax.grad(slope))(zq), jax.grad(slope)(z))
    _assert_close(
        quax.quaxify(lambda z: jax.jvp(slope, (z,), (dz,)))(zq),
        jax.jvp(slope, (z,), (dz,)),
    )
