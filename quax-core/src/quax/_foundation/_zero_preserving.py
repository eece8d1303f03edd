"""The elementwise primitives that map zero to zero."""

from jax.extend.core import primitives as prims


__all__ = ["ZERO_PRESERVING"]


ZERO_PRESERVING = frozenset(
    {
        prims.neg_p,
        prims.abs_p,
        prims.sign_p,
        prims.floor_p,
        prims.ceil_p,
        prims.round_p,
        prims.sin_p,
        prims.tan_p,
        prims.sinh_p,
        prims.tanh_p,
        prims.asin_p,
        prims.atan_p,
        prims.asinh_p,
        prims.atanh_p,
        prims.expm1_p,
        prims.log1p_p,
        prims.sqrt_p,
        prims.cbrt_p,
        prims.erf_p,
        prims.erf_inv_p,
        prims.square_p,
        prims.conj_p,
        prims.real_p,
        prims.imag_p,
        prims.population_count_p,
        prims.reduce_precision_p,
    }
)
"""The unary elementwise primitives `f` with `f(0) = 0` whatever their parameters,
whose output has the shape of their input: `neg`, `abs`, `sign`, `floor`, `ceil`,
`round`, `sin`, `tan`, `sinh`, `tanh`, `asin`, `atan`, `asinh`, `atanh`, `expm1`,
`log1p`, `sqrt`, `cbrt`, `erf`, `erf_inv`, `square`, `conj`, `real`, `imag`,
`population_count` and `reduce_precision` (a `frozenset` of JAX primitives).

A value type that stores only its nonzero elements (sparse, symbolic zeros, masked
arrays) can apply any of them to its stored elements alone. Use it with
[`quax.register_elementwise`][]:

```python
@quax.register_elementwise(quax.ZERO_PRESERVING)
def _(primitive, x: MySparse, **params) -> MySparse:
    return MySparse(primitive.bind(x.data, **params), x.indices, x.shape)
```

Of these, `neg`, `conj`, `real` and `imag` are also linear (`f(a + b) = f(a) + f(b)`):
entries stored twice at one position may stay apart; for the others they must be
summed first. Left out although they map zero to zero: `integer_pow` (only for a
positive exponent), `convert_element_type` and `bitcast_convert_type` (their
parameters describe the output's dtype and sharding; a bitcast between widths
changes the shape): register those on their own.
"""
