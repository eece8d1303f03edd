"""The primitives behind `ustrip`: `strip_p` and the two that carry its derivatives,
with their JAX rules (evaluation, abstract evaluation, JVP, transpose, batching,
lowering). Their quax rules, on quantities, are in `_rules/_strip.py`."""

from typing import Any

import jax
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from quax.extend import define_batching_rule

from ._dimensions import Dimensions, UnitError, dimensionless
from ._units import si_unit


__all__ = ["per_unit_p", "strip_p", "tangent_strip_p"]


def _check_dimensions(want: Dimensions | None, got: Dimensions) -> None:
    if want is not None and want != got:
        name = "a plain (dimensionless) array" if got.is_dimensionless else str(got)
        raise UnitError(
            f"Cannot express {name} in {si_unit(want)} ({want}): the dimensions differ."
        )


# `strip_p`: the numbers of a quantity, under transforms ------------------------------
#
# `ustrip` binds `strip_p` on tracers, so that inside `quax.quaxify` its rule sees the
# quantity itself and checks its dimensions. Under autodiff, the tangent (whose units
# come from the program's residuals) is stripped by `tangent_strip_p`, which keeps
# the primal as a residual: its transpose (`per_unit_p`) divides the cotangent by
# the primal's units. So the gradient of `ustrip("J", energy)` with respect to `v`
# is in `1 / (m / s)`, as that of any plain output: one over the input's units.

strip_p = Primitive("quax_units_strip")
tangent_strip_p = Primitive("quax_units_tangent_strip")
per_unit_p = Primitive("quax_units_per_unit")


def _first(x: Any, *rest: Any, **params: Any) -> Any:
    del rest, params
    return x


def _zero_tangent(primal: Any) -> Any:
    return ad.Zero(jax.typeof(primal).to_tangent_aval())


def _strip_plain(x: Any, *, dimensions: Dimensions) -> Any:
    _check_dimensions(dimensions, dimensionless)
    return x


def _strip_jvp(primals: Any, tangents: Any, *, dimensions: Dimensions) -> Any:
    (x,), (t,) = primals, tangents
    out = strip_p.bind(x, dimensions=dimensions)
    if type(t) is ad.Zero:
        return out, _zero_tangent(out)
    return out, tangent_strip_p.bind(t, x)


def _tangent_strip_transpose(ct: Any, t: Any, x: Any) -> list[Any]:
    del t
    if type(ct) is ad.Zero:
        return [ad.Zero(ct.aval), None]
    return [per_unit_p.bind(ct, x), None]


def _per_unit_transpose(ct: Any, y: Any, x: Any) -> list[Any]:
    del y
    if type(ct) is ad.Zero:
        return [ad.Zero(ct.aval), None]
    return [tangent_strip_p.bind(ct, x), None]


def _linear_jvp(primitive: Primitive) -> Any:
    # Linear in its first operand; the second only gives units.
    def jvp(primals: Any, tangents: Any) -> Any:
        out = primitive.bind(*primals)
        if type(tangents[0]) is ad.Zero:
            return out, _zero_tangent(out)
        return out, primitive.bind(tangents[0], primals[1])

    return jvp


def _batch(primitive: Primitive) -> Any:
    def rule(args: Any, axes: Any, **params: Any) -> Any:
        if len(args) > 1 and axes[1] is not None:
            # The reference's units do not depend on the batch: any element will do.
            args = (args[0], lax.index_in_dim(args[1], 0, axes[1], keepdims=False))
        return primitive.bind(*args, **params), axes[0]

    return rule


strip_p.def_impl(_strip_plain)
strip_p.def_abstract_eval(_strip_plain)
ad.primitive_jvps[strip_p] = _strip_jvp
for _p, _transpose in [
    (tangent_strip_p, _tangent_strip_transpose),
    (per_unit_p, _per_unit_transpose),
]:
    _p.def_impl(_first)
    _p.def_abstract_eval(_first)
    ad.primitive_jvps[_p] = _linear_jvp(_p)
    ad.primitive_transposes[_p] = _transpose
for _p in (strip_p, tangent_strip_p, per_unit_p):
    define_batching_rule(_p, _batch(_p))
    mlir.register_lowering(_p, mlir.lower_fun(_first, multiple_results=False))
