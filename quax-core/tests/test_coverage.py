"""Every public function of `jax.lax`, `jax.numpy`, `jax.numpy.linalg` and `jax.nn`
runs on `Dense` (a wrapper whose rules unwrap, bind and rewrap) and agrees with JAX.

Each public name is in exactly one of `CASES` (tested here), `NOT_APPLICABLE` (no
array computation to run: classes, dtypes, constants, functions of shapes only, ...)
or `UNSUPPORTED` (with the reason); `test_every_public_name_is_accounted_for` fails
when JAX adds a name, so new functions cannot slip through.
"""

import functools as ft
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
import quax.testing
from jax import lax
from jax.extend.core import Primitive

from .helpers import Dense, dense


MODULES: dict[str, types.ModuleType] = {
    "lax": lax,
    "jnp": jnp,
    "linalg": jnp.linalg,
    "nn": jax.nn,
}

# Sample inputs ------------------------------------------------------------------------

X = jnp.linspace(0.1, 0.9, 12, dtype=jnp.float32).reshape(3, 4)  # inside (0, 1)
Y = jnp.linspace(1.3, 2.4, 12, dtype=jnp.float32).reshape(3, 4)[::-1]  # above 1
V = jnp.array([0.3, -1.2, 2.5, 0.7], jnp.float32)
W = jnp.array([1.5, 0.4, -0.6, 2.0], jnp.float32)
K = jnp.arange(1, 13, dtype=jnp.int32).reshape(3, 4)  # no zeros
J = jnp.array([[3, 1, 2, 5], [7, 2, 9, 4], [1, 8, 6, 3]], jnp.int32)
U = jnp.arange(1, 13, dtype=jnp.uint32).reshape(3, 4)
B = jnp.array(
    [[True, False, True, True], [False, False, True, False], [True, True, False, True]]
)
Z = jnp.array([[1 + 2j, -0.5j, 3.0, 0.25 + 0.5j]], jnp.complex64)
M = jnp.array([[4.0, 1.0, 0.5], [1.0, 3.0, -0.2], [0.5, -0.2, 2.0]], jnp.float32)  # SPD
N = jnp.array(
    [[2.0, -1.0, 0.3], [0.7, 1.5, -0.4], [0.1, 0.9, 3.0]], jnp.float32
)  # general
R = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4) / 10
IDX = jnp.array([2, 0, 1], jnp.int32)
KEY = jnp.array([0, 1, 2, 3], jnp.uint32)

# name -> (function, arguments); every array in the arguments is wrapped in `Dense`.
CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {}


def _add(module: str, names: str, *args: Any) -> None:
    for name in names.split():
        CASES[f"{module}.{name}"] = (getattr(MODULES[module], name), args)


def _on_list(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` taking its arrays as one list argument, called with them separately."""
    return lambda *xs: fn(list(xs))


def _case(name: str, fn: Callable[..., Any], *args: Any) -> None:
    CASES[name] = (fn, args)


# jax.lax: elementwise.
_add(
    "lax",
    "abs asin asinh atan atanh bessel_i0e bessel_i1e cbrt ceil cos cosh digamma",
    X,
)
_add(
    "lax",
    "erf erf_inv erfc exp exp2 expm1 floor is_finite lgamma log log1p logistic",
    X,
)
_add("lax", "neg reciprocal round rsqrt sign sin sinh sqrt square tan tanh acos", X)
_add("lax", "stop_gradient optimization_barrier", X)
_add("lax", "acosh", Y)
_add("lax", "real imag conj", Z)
_add("lax", "bitwise_not clz population_count", K)
_add("lax", "add atan2 div max min mul nextafter pow rem sub eq ge gt le lt ne", X, Y)
_add("lax", "igamma igammac igamma_grad_a random_gamma_grad complex", Y, X)
_add("lax", "zeta", Y + 1, X)
_add("lax", "bitwise_and bitwise_or bitwise_xor shift_left", K, J)
_add("lax", "shift_right_arithmetic shift_right_logical", K, J % 3)
_add("lax", "mulhi", U, U + 7)
_add("lax", "clamp", jnp.float32(0.3), X, jnp.float32(0.6))
_add("lax", "betainc", X + 1, Y, X)
_add("lax", "select", B, X, Y)
_add("lax", "select_n", K % 3, X, Y, X * 2)
_case("lax.polygamma", lax.polygamma, jnp.full((3, 4), 2.0), Y)
_case("lax.integer_pow", lambda x: lax.integer_pow(x, 3), X)
_case(
    "lax.convert_element_type", lambda x: lax.convert_element_type(x, jnp.int32), Y * 3
)
_case("lax.bitcast_convert_type", lambda x: lax.bitcast_convert_type(x, jnp.int32), X)
_case("lax.reduce_precision", lambda x: lax.reduce_precision(x, 5, 10), X)
# jax.lax: shapes, indexing, reductions.
_case("lax.argmax", lambda x: lax.argmax(x, 1, jnp.int32), J)
_case("lax.argmin", lambda x: lax.argmin(x, 0, jnp.int32), J)
_case("lax.broadcast", lambda x: lax.broadcast(x, (2,)), X)
_case("lax.broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (3, 2, 4), (0, 2)), X)
_case("lax.broadcast_like", lax.broadcast_like, V, X)
_case("lax.broadcast_to_rank", lambda x: lax.broadcast_to_rank(x, 3), X)
_case("lax.collapse", lambda x: lax.collapse(x, 0, 2), R)
_case("lax.concatenate", lambda a, b: lax.concatenate([a, b], 1), X, Y)
_case("lax.expand_dims", lambda x: lax.expand_dims(x, (0, 2)), X)
_case("lax.reshape", lambda x: lax.reshape(x, (4, 3)), X)
_case("lax.rev", lambda x: lax.rev(x, (1,)), X)
_case("lax.squeeze", lambda x: lax.squeeze(x, (0,)), X[None])
_case("lax.transpose", lambda x: lax.transpose(x, (2, 0, 1)), R)
_case("lax.pad", lambda x: lax.pad(x, jnp.float32(-1), [(1, 0, 1), (0, 2, 0)]), X)
_case("lax.slice", lambda x: lax.slice(x, (0, 1), (3, 4), (2, 1)), X)
_case("lax.slice_in_dim", lambda x: lax.slice_in_dim(x, 1, 3, axis=1), X)
_case("lax.index_in_dim", lambda x: lax.index_in_dim(x, 1, 0), X)
_case(
    "lax.dynamic_slice",
    lambda x, i: lax.dynamic_slice(x, (i, 1), (2, 2)),
    X,
    jnp.int32(1),
)
_case(
    "lax.dynamic_slice_in_dim",
    lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, 1),
    X,
    jnp.int32(1),
)
_case(
    "lax.dynamic_index_in_dim",
    lambda x, i: lax.dynamic_index_in_dim(x, i, 1),
    X,
    jnp.int32(2),
)
_case(
    "lax.dynamic_update_slice",
    lambda x, u: lax.dynamic_update_slice(x, u, (1, 1)),
    X,
    Y[:2, :2],
)
_case(
    "lax.dynamic_update_slice_in_dim",
    lambda x, u: lax.dynamic_update_slice_in_dim(x, u, 1, 0),
    X,
    Y[:2],
)
_case(
    "lax.dynamic_update_index_in_dim",
    lambda x, u: lax.dynamic_update_index_in_dim(x, u, 1, 0),
    X,
    V,
)
# `idxs` is a sequence of index arrays, one per axis (JAX iterates over it); its
# annotation says `Array`.
_case(
    "lax.index_take",
    lambda x, i: lax.index_take(x, (i,), (0,)),  # pyright: ignore[reportArgumentType]
    X,
    IDX,
)
_case("lax.split", lambda x: lax.split(x, (1, 3), axis=1), X)
_case("lax.stack", lambda a, b: lax.stack([a, b], 1), X, Y)
_case("lax.unstack", lambda x: lax.unstack(x, 1), X)
_case("lax.tile", lambda x: lax.tile(x, (2, 1)), X)
_case("lax.full_like", lambda x: lax.full_like(x, 2.0), X)
_case("lax.reduce_sum", lambda x: lax.reduce_sum(x, (1,)), X)
_case("lax.reduce_prod", lambda x: lax.reduce_prod(x, (0,)), X)
_case("lax.reduce_max", lambda x: lax.reduce_max(x, (0, 1)), X)
_case("lax.reduce_min", lambda x: lax.reduce_min(x, (1,)), X)
_case("lax.reduce_and", lambda x: lax.reduce_and(x, (1,)), B)
_case("lax.reduce_or", lambda x: lax.reduce_or(x, (0,)), B)
_case("lax.reduce_xor", lambda x: lax.reduce_xor(x, (1,)), K)
_case("lax.reduce", lambda x: lax.reduce(x, jnp.float32(0), lax.add, (0,)), X)
_case(
    "lax.reduce_window",
    lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID"),
    X,
)
_case("lax.cumsum", lambda x: lax.cumsum(x, 1), X)
_case("lax.cumprod", lambda x: lax.cumprod(x, 0, reverse=True), X)
_case("lax.cummax", lambda x: lax.cummax(x, 1), J)
_case("lax.cummin", lambda x: lax.cummin(x, 0), J)
_case("lax.cumlogsumexp", lambda x: lax.cumlogsumexp(x, 1), X)
_case("lax.sort", lambda x: lax.sort(x, dimension=1), J)
_case("lax.sort_key_val", lambda k, v: lax.sort_key_val(k, v, 1), J, X)
_case("lax.top_k", lambda x: lax.top_k(x, 2), X)
_case("lax.approx_max_k", lambda x: lax.approx_max_k(x, 2), X)
_case("lax.approx_min_k", lambda x: lax.approx_min_k(x, 2), X)
_case("lax.dot", lax.dot, X, Y.T)
_case(
    "lax.dot_general",
    lambda a, b: lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))),
    R,
    jnp.ones((2, 4, 5)),
)
_case("lax.batch_matmul", lax.batch_matmul, R, jnp.ones((2, 4, 5)))
_case(
    "lax.ragged_dot",
    lambda a, b, g: lax.ragged_dot(a, b, g),
    X.T,
    jnp.ones((2, 3, 5)),
    jnp.array([1, 3], jnp.int32),
)
_case(
    "lax.ragged_dot_general",
    lambda a, b, g: lax.ragged_dot_general(
        a,
        b,
        g,
        lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(((1,), (1,)), ((), ())),
            lhs_ragged_dimensions=[0],
            rhs_group_dimensions=[0],
        ),
    ),
    X.T,
    jnp.ones((2, 3, 5)),
    jnp.array([1, 3], jnp.int32),
)
_IMG = jnp.linspace(-1, 1, 2 * 2 * 6 * 5, dtype=jnp.float32).reshape(2, 2, 6, 5)  # NCHW
_KER = jnp.linspace(-1, 1, 3 * 2 * 3 * 2, dtype=jnp.float32).reshape(3, 2, 3, 2)  # OIHW
_case("lax.conv", lambda a, k: lax.conv(a, k, (1, 1), "SAME"), _IMG, _KER)
_case(
    "lax.conv_with_general_padding",
    lambda a, k: lax.conv_with_general_padding(
        a, k, (1, 2), [(1, 0), (0, 1)], (1, 1), (2, 1)
    ),
    _IMG,
    _KER,
)
_case(
    "lax.conv_general_dilated",
    lambda a, k: lax.conv_general_dilated(a, k, (2, 1), "VALID", rhs_dilation=(1, 2)),
    _IMG,
    _KER,
)
_case(
    "lax.conv_general_dilated_patches",
    lambda a: lax.conv_general_dilated_patches(a, (2, 2), (1, 1), "VALID"),
    _IMG,
)
_case(
    "lax.conv_general_dilated_local",
    lambda a, k: lax.conv_general_dilated_local(a, k, (1, 1), "VALID", (2, 2)),
    _IMG,
    jnp.ones((3, 8, 5, 4)),
)
_case(
    "lax.conv_transpose",
    lambda a, k: lax.conv_transpose(
        a, k, (2, 2), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")
    ),
    _IMG,
    _KER,
)
_case("lax.fft", lambda z: lax.fft(z, lax.FftType.FFT, (4,)), Z)
_case(
    "lax.gather",
    lambda x, i: lax.gather(
        x,
        i[:, None],
        lax.GatherDimensionNumbers(
            offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)
        ),
        (1, 4),
    ),
    X,
    IDX,
)
_SCATTER = lax.ScatterDimensionNumbers(
    update_window_dims=(1,),
    inserted_window_dims=(0,),
    scatter_dims_to_operand_dims=(0,),
)
for _name in [
    "scatter",
    "scatter_add",
    "scatter_sub",
    "scatter_mul",
    "scatter_max",
    "scatter_min",
]:
    _case(
        f"lax.{_name}",
        ft.partial(
            lambda f, x, i, u: f(x, i[:2, None], u, _SCATTER), getattr(lax, _name)
        ),
        X,
        IDX,
        Y[:2],
    )
_case(
    "lax.scatter_apply",
    lambda x, i: lax.scatter_apply(
        x, i[:2, None], jnp.sin, _SCATTER, update_shape=(2, 4)
    ),
    X,
    IDX,
)
_case("lax.associative_scan", lambda x: lax.associative_scan(lax.add, x, axis=1), X)
_case(
    "lax.cond",
    lambda p, x, y: lax.cond(p, lambda a, b: a * b, lambda a, b: a - b, x, y),
    jnp.bool_(True),
    X,
    Y,
)
_case(
    "lax.switch",
    lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.exp], x),
    jnp.int32(1),
    X,
)
_case("lax.fori_loop", lambda x: lax.fori_loop(0, 3, lambda i, c: c * 2 + i, x), X)
_case(
    "lax.while_loop",
    lambda x: lax.while_loop(lambda c: c[0, 0] < 5, lambda c: c * 2, x),
    X,
)
_case(
    "lax.scan", lambda c, xs: lax.scan(lambda c, x: (c + x, c * x), c, xs), V[:3], X.T
)
_case("lax.map", lambda x: lax.map(jnp.sum, x), X)
_case(
    "lax.custom_linear_solve",
    lambda m, b: lax.custom_linear_solve(
        lambda v: m @ v, b, lambda mv, v: jnp.linalg.solve(m, v)
    ),
    M,
    V[:3],
)
_case(
    "lax.custom_root",
    lambda x: lax.custom_root(
        lambda y: y * y - x,
        jnp.ones_like(x),
        lambda f, y0: lax.fori_loop(0, 20, lambda i, y: y - f(y) / (2 * y), y0),
        lambda g, y: y / 2,
    ),
    Y,
)
_case(
    "lax.composite",
    lambda x: lax.composite(lambda v: jnp.sin(v) * 2, name="my.sin2")(x),
    X,
)
_case(
    "lax.platform_dependent",
    lambda x: lax.platform_dependent(x, default=jnp.sin, cpu=jnp.cos),
    X,
)
_case("lax.scaled_dot", lambda a, b: lax.scaled_dot(a, b), X, Y.T)
_case("lax.rng_bit_generator", lambda k: lax.rng_bit_generator(k, (2, 3)), KEY)
_case(
    "lax.with_sharding_constraint",
    lambda x: lax.with_sharding_constraint(
        x, jax.sharding.SingleDeviceSharding(jax.devices()[0])
    ),
    X,
)
_case("lax.stage", lax.stage, X)


# Collectives, under a named `vmap` axis.
def _named(fn: Callable[..., Any]) -> Callable[..., Any]:
    return jax.vmap(fn, axis_name="i")


_case("lax.psum", _named(lambda x: lax.psum(x, "i")), X)
_case("lax.pmean", _named(lambda x: lax.pmean(x, "i")), X)
_case("lax.pmax", _named(lambda x: lax.pmax(x, "i")), X)
_case("lax.pmin", _named(lambda x: lax.pmin(x, "i")), X)
_case("lax.all_gather", _named(lambda x: lax.all_gather(x, "i")), X)
_case(
    "lax.all_to_all",
    _named(lambda x: lax.all_to_all(x, "i", 0, 0)),
    jnp.ones((3, 3, 2)),
)
_case(
    "lax.ppermute", _named(lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2), (2, 0)])), X
)
_case("lax.pshuffle", _named(lambda x: lax.pshuffle(x, "i", [2, 0, 1])), X)
_case(
    "lax.psum_scatter",
    _named(lambda x: lax.psum_scatter(x, "i", tiled=True)),
    jnp.ones((3, 6)),
)
_case("lax.pswapaxes", _named(lambda x: lax.pswapaxes(x, "i", 0)), jnp.ones((3, 3, 2)))
_case("lax.axis_index", _named(lambda x: x * lax.axis_index("i")), X)
_case("lax.axis_size", _named(lambda x: x * lax.axis_size("i")), X)
# Varying-manual-axes casts, under a one-device `shard_map`.
_MESH_FN = lambda f: jax.shard_map(
    f, mesh=jax.make_mesh((1,), ("i",)), in_specs=jax.P(), out_specs=jax.P("i")
)
_case("lax.pcast", _MESH_FN(lambda x: lax.pcast(x, "i", to="varying")), X)

# jax.numpy: elementwise.
_UNARY = """abs absolute acos arccos arcsin arctan arctanh asin atan atanh arcsinh asinh
    cbrt ceil conj conjugate cos cosh deg2rad degrees exp exp2 expm1 fabs floor
    i0 imag isfinite isinf isnan isneginf isposinf isreal iscomplex log log10 log1p
    log2 negative positive rad2deg radians real reciprocal rint round sign signbit sin
    sinc sinh spacing sqrt square tan tanh trunc angle nan_to_num frexp modf around
    copy ravel atleast_1d atleast_2d atleast_3d ndim shape size isscalar iscomplexobj
    isrealobj result_type iterable array asarray transpose matrix_transpose squeeze"""
_add("jnp", _UNARY, X)
_add("jnp", "arccosh acosh", Y)
_add("jnp", "bitwise_count bitwise_invert bitwise_not invert", K)
_add("jnp", "logical_not", B)
_BINARY = """add arctan2 atan2 copysign divide divmod equal float_power floor_divide
    fmax fmin fmod greater greater_equal heaviside hypot less less_equal logaddexp
    logaddexp2 maximum minimum mod multiply nextafter not_equal pow power remainder
    subtract true_divide isclose allclose array_equal array_equiv"""
_add("jnp", _BINARY, X, Y)
_add("jnp", "logical_and logical_or logical_xor", B, ~B)
_add(
    "jnp",
    "bitwise_and bitwise_or bitwise_xor gcd lcm bitwise_left_shift left_shift",
    K,
    J,
)
_add("jnp", "bitwise_right_shift right_shift", K, J % 3)
_case("jnp.ldexp", jnp.ldexp, X, J)
_case("jnp.clip", lambda x: jnp.clip(x, 0.3, 0.6), X)
_case("jnp.where", jnp.where, B, X, Y)
_case("jnp.select", lambda a, b, x, y: jnp.select([a, b], [x, y], 0.5), B, ~B, X, Y)
_case("jnp.choose", lambda i, x, y: jnp.choose(i, [x, y], mode="clip"), K % 2, X, Y)
_case(
    "jnp.piecewise",
    lambda x: jnp.piecewise(x, [x < 0.5, x >= 0.5], [jnp.sin, lambda v: v * 2]),
    X,
)
_case("jnp.astype", lambda x: jnp.astype(x, jnp.int32), Y * 3)
# jax.numpy: reductions and statistics.
_REDUCTIONS = """all any amax amin argmax argmin count_nonzero max mean median min
    nanargmax nanargmin nanmax nanmean nanmedian nanmin nanprod nanstd nansum nanvar
    prod ptp std sum var argsort cumprod cumsum nancumprod nancumsum cumulative_prod
    cumulative_sum sort average diff"""
for _name in _REDUCTIONS.split():
    _case(f"jnp.{_name}", ft.partial(getattr(jnp, _name), axis=1), X)
_case("jnp.percentile", lambda x: jnp.percentile(x, 30.0, axis=1), X)
_case("jnp.nanpercentile", lambda x: jnp.nanpercentile(x, 30.0, axis=1), X)
_case("jnp.quantile", lambda x: jnp.quantile(x, 0.3, axis=0), X)
_case("jnp.nanquantile", lambda x: jnp.nanquantile(x, 0.3, axis=0), X)
_case("jnp.corrcoef", jnp.corrcoef, X)
_case("jnp.cov", jnp.cov, X)
_case("jnp.ediff1d", jnp.ediff1d, V)
_case("jnp.gradient", jnp.gradient, X)
_case("jnp.trapezoid", jnp.trapezoid, X)
_case("jnp.trace", jnp.trace, X)
_case("jnp.partition", lambda x: jnp.partition(x, 1, axis=1), J)
_case("jnp.argpartition", lambda x: jnp.argpartition(x, 1, axis=1), J)
_case("jnp.lexsort", lambda a, b: jnp.lexsort([a, b]), J, K % 2)
_case("jnp.sort_complex", jnp.sort_complex, Z)
_case("jnp.searchsorted", jnp.searchsorted, jnp.sort(V), W)
_case("jnp.digitize", jnp.digitize, X, jnp.array([0.2, 0.5, 0.8]))
_case("jnp.histogram", lambda x: jnp.histogram(x, bins=3), X)
_case("jnp.histogram_bin_edges", lambda x: jnp.histogram_bin_edges(x, bins=3), X)
_case("jnp.histogram2d", lambda x, y: jnp.histogram2d(x, y, bins=3), V, W)
_case("jnp.histogramdd", lambda x: jnp.histogramdd(x, bins=3), X.T)
_case("jnp.bincount", lambda i: jnp.bincount(i, length=14), K.ravel())
_case(
    "jnp.interp", jnp.interp, X, jnp.array([0.0, 0.5, 1.0]), jnp.array([1.0, 3.0, 2.0])
)
_case("jnp.unwrap", jnp.unwrap, Y * 3)
# jax.numpy: shapes and indexing.
_case("jnp.reshape", lambda x: jnp.reshape(x, (4, 3)), X)
_case("jnp.resize", lambda x: jnp.resize(x, (5, 3)), X)
_case("jnp.broadcast_to", lambda x: jnp.broadcast_to(x, (2, 3, 4)), X)
_case("jnp.broadcast_arrays", jnp.broadcast_arrays, X, V)
_case("jnp.expand_dims", lambda x: jnp.expand_dims(x, 1), X)
_case("jnp.moveaxis", lambda x: jnp.moveaxis(x, 0, 2), R)
_case("jnp.rollaxis", lambda x: jnp.rollaxis(x, 2), R)
_case("jnp.swapaxes", lambda x: jnp.swapaxes(x, 0, 2), R)
_case("jnp.permute_dims", lambda x: jnp.permute_dims(x, (1, 2, 0)), R)
_case("jnp.flip", lambda x: jnp.flip(x, 1), X)
_add("jnp", "fliplr flipud rot90 flatnonzero", X)
CASES["jnp.flatnonzero"] = (lambda x: jnp.flatnonzero(x > 0.5, size=12), (X,))
_case("jnp.roll", lambda x: jnp.roll(x, 2, axis=1), X)
_case("jnp.tile", lambda x: jnp.tile(x, (2, 1)), X)
_case("jnp.repeat", lambda x: jnp.repeat(x, 2, axis=0), X)
_case("jnp.pad", lambda x: jnp.pad(x, ((1, 0), (2, 1)), mode="reflect"), X)
_case("jnp.concatenate", lambda a, b: jnp.concatenate([a, b], 0), X, Y)
_case("jnp.concat", lambda a, b: jnp.concat([a, b], axis=1), X, Y)
_case("jnp.append", jnp.append, X, Y)
for _name in ["stack", "hstack", "vstack", "dstack", "column_stack"]:
    _case(f"jnp.{_name}", _on_list(getattr(jnp, _name)), X, Y)
_case("jnp.block", lambda a, b: jnp.block([[a, b], [b, a]]), X, Y)
_case("jnp.split", lambda x: jnp.split(x, 2, axis=1), X)
_case("jnp.array_split", lambda x: jnp.array_split(x, 3, axis=1), X)
_case("jnp.hsplit", lambda x: jnp.hsplit(x, 2), X)
_case("jnp.vsplit", lambda x: jnp.vsplit(x, 3), X)
_case("jnp.dsplit", lambda x: jnp.dsplit(x, 2), R)
_case("jnp.unstack", jnp.unstack, X)
_case("jnp.take", lambda x, i: jnp.take(x, i, axis=1), X, IDX)
_case("jnp.take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), X, J % 4)
_case(
    "jnp.put_along_axis",
    lambda x, i, v: jnp.put_along_axis(x, i, v, axis=1, inplace=False),
    X,
    J[:, :1] % 4,
    Y[:, :1],
)
_case("jnp.put", lambda x, i, v: jnp.put(x, i, v, inplace=False), X, IDX, V[:3])
_case("jnp.place", lambda x, m, v: jnp.place(x, m, v, inplace=False), X, B, V)
_case("jnp.fill_diagonal", lambda x: jnp.fill_diagonal(x, 5.0, inplace=False), X)
_case("jnp.compress", lambda c, x: jnp.compress(c, x, axis=1, size=2), B[0], X)
_case("jnp.extract", lambda c, x: jnp.extract(c, x, size=6), B, X)
_case("jnp.delete", lambda x: jnp.delete(x, 1, axis=1), X)
_case("jnp.insert", lambda x, v: jnp.insert(x, 1, v, axis=1), X, V[:3])
_case("jnp.diag", jnp.diag, X)
_case("jnp.diagflat", jnp.diagflat, V)
_case("jnp.diagonal", jnp.diagonal, X)
_case("jnp.diag_indices_from", jnp.diag_indices_from, M)
_case("jnp.tril", jnp.tril, X)
_case("jnp.triu", jnp.triu, X)
_case("jnp.tril_indices_from", jnp.tril_indices_from, X)
_case("jnp.triu_indices_from", jnp.triu_indices_from, X)
_case("jnp.nonzero", lambda x: jnp.nonzero(x, size=12), B)
_case("jnp.argwhere", lambda x: jnp.argwhere(x, size=12), B)
_case(
    "jnp.ravel_multi_index",
    lambda i, j: jnp.ravel_multi_index((i, j), (3, 13), mode="clip"),
    K % 3,
    K,
)
_case("jnp.unravel_index", lambda i: jnp.unravel_index(i, (3, 4)), K)
_case("jnp.ix_", jnp.ix_, IDX, jnp.array([0, 3], jnp.int32))
_case("jnp.packbits", jnp.packbits, B)
_case("jnp.unpackbits", jnp.unpackbits, jnp.array([3, 250], jnp.uint8))
_case("jnp.isin", jnp.isin, J, jnp.array([1, 2, 3], jnp.int32))
_case("jnp.unique", lambda x: jnp.unique(x, size=6, fill_value=0), J)
_case("jnp.unique_all", lambda x: jnp.unique_all(x, size=6, fill_value=0), J)
_case("jnp.unique_counts", lambda x: jnp.unique_counts(x, size=6, fill_value=0), J)
_case("jnp.unique_inverse", lambda x: jnp.unique_inverse(x, size=6, fill_value=0), J)
_case("jnp.unique_values", lambda x: jnp.unique_values(x, size=6, fill_value=0), J)
for _name in ["union1d", "intersect1d", "setdiff1d", "setxor1d"]:
    _case(
        f"jnp.{_name}",
        ft.partial(getattr(jnp, _name), size=8, fill_value=0),
        J[0],
        J[1],
    )
# jax.numpy: products, polynomials, windows.
_add("jnp", "dot inner matmul vdot", X, Y.T)
CASES["jnp.inner"] = (jnp.inner, (X, Y))
CASES["jnp.vdot"] = (jnp.vdot, (X, Y))
_add("jnp", "outer kron", V, W)
_case("jnp.cross", jnp.cross, V[:3], W[:3])
_case("jnp.tensordot", lambda a, b: jnp.tensordot(a, b, 1), X, Y.T)
_case("jnp.einsum", lambda a, b: jnp.einsum("ij,kj->ik", a, b), X, Y)
_case("jnp.matvec", jnp.matvec, X, V)
_case("jnp.vecmat", jnp.vecmat, V[:3], X)
_case("jnp.vecdot", jnp.vecdot, X, Y)
_case("jnp.convolve", jnp.convolve, V, W[:3])
_case("jnp.correlate", lambda a, b: jnp.correlate(a, b, mode="full"), V, W[:3])
_case("jnp.polyval", jnp.polyval, V, X)
_add("jnp", "polyadd polymul polysub", V, W[:3])
_case("jnp.polydiv", jnp.polydiv, V, W[:2])
_case("jnp.polyder", lambda p: jnp.polyder(p, 2), V)
_case("jnp.polyint", lambda p: jnp.polyint(p, k=1.0), V)
_case("jnp.polyfit", lambda x, y: jnp.polyfit(x, y, 2), V, W)
_case("jnp.poly", jnp.poly, V)
_case("jnp.roots", lambda p: jnp.roots(p, strip_zeros=False), V)
_case("jnp.vander", lambda x: jnp.vander(x, 3), V)
_case("jnp.kaiser", lambda b: jnp.kaiser(5, b), jnp.float32(3.0))
_case("jnp.apply_along_axis", lambda x: jnp.apply_along_axis(jnp.sum, 1, x), X)
_case("jnp.apply_over_axes", lambda x: jnp.apply_over_axes(jnp.sum, x, [0, 1]), X)
_case("jnp.vectorize", lambda x, y: jnp.vectorize(lambda a, b: a * b + 1)(x, y), X, V)
_case("jnp.frompyfunc", lambda x, y: jnp.frompyfunc(lax.add, 2, 1)(x, y), X, Y)
_case("jnp.empty_like", lambda x: jnp.empty_like(x).shape, X)
_add("jnp", "zeros_like ones_like", X)
_case("jnp.full_like", lambda x: jnp.full_like(x, 3.0), X)
_case("jnp.meshgrid", jnp.meshgrid, V, W[:3])
# Constructors whose arguments may be arrays (start/stop, fill value).
_case("jnp.linspace", lambda a, b: jnp.linspace(a, b, 5), V, W)
_case("jnp.logspace", lambda a, b: jnp.logspace(a, b, 5), V, W)
_case("jnp.geomspace", lambda a, b: jnp.geomspace(a, b, 5), Y[0], Y[1])
_case("jnp.full", lambda v: jnp.full((2, 4), v), V)

# jax.numpy.linalg.
_add("linalg", "cholesky det eigh eigvalsh slogdet cond matrix_rank pinv svdvals", M)
_add("linalg", "eig eigvals qr svd norm matrix_norm", N)
_add("linalg", "diagonal matrix_transpose trace vector_norm", X)
_add("linalg", "solve lstsq", N, M)
_add("linalg", "matmul", X, Y.T)
_add("linalg", "outer", V, W)
_add("linalg", "cross", V[:3], W[:3])
_add("linalg", "vecdot", X, Y)
_case("linalg.tensordot", lambda a, b: jnp.linalg.tensordot(a, b, axes=1), X, Y.T)
_case("linalg.matrix_power", lambda m: jnp.linalg.matrix_power(m, 3), N)
_case("linalg.multi_dot", lambda a, b, c: jnp.linalg.multi_dot([a, b, c]), X, Y.T, N)
_case("linalg.tensorsolve", jnp.linalg.tensorsolve, N, V[:3])
_case("linalg.inv", jnp.linalg.inv, M)
_case("linalg.tensorinv", lambda a: jnp.linalg.tensorinv(a, ind=1), N)

# jax.nn.
_NN = """celu elu gelu glu hard_sigmoid hard_silu hard_swish hard_tanh identity
    leaky_relu log_sigmoid log_softmax logsumexp mish relu relu6 selu sigmoid silu
    soft_sign softmax softplus sparse_plus sparse_sigmoid squareplus standardize
    swish tanh logmeanexp"""
_add("nn", _NN, X - 0.5)
_case("nn.log1mexp", jax.nn.log1mexp, X)
_case("nn.one_hot", lambda i: jax.nn.one_hot(i, 13), K)
_case(
    "nn.dot_product_attention",
    jax.nn.dot_product_attention,
    R[None],
    R[None] * 2,
    R[None] + 1,
)
_case(
    "nn.scaled_dot_general",
    lambda a, b: jax.nn.scaled_dot_general(a, b, (((1,), (1,)), ((), ()))),
    X,
    Y,
)

# What is not tested, and why ---------------------------------------------------------

_NO_ARRAY = "takes no array input (shapes, dtypes or Python scalars only)"
_SHAPES = "computes with static shapes or parameters only"
_DTYPES = "dtype introspection: takes dtypes, not arrays"
_IO = "host-side K/O or printing, not an array computation"

# Public names that JAX 0.11 adds (quax-core runs under it too; 0.10 is pinned).
if hasattr(lax, "log2"):
    _add("lax", "log2 one_minus_square", X)
if hasattr(jnp, "top_k"):
    # Absent from the pinned JAX's stubs, hence the ignores.
    _case("jnp.top_k", lambda x: jnp.top_k(x, 2), X)  # pyright: ignore[reportAttributeAccessIssue]
    _case("jnp.minmax", lambda x: jnp.minmax(x, axis=1), X)  # pyright: ignore[reportAttributeAccessIssue]


NOT_APPLICABLE: dict[str, str] = {
    **dict.fromkeys(
        [
            f"lax.{n}"
            for n in [
                "after_all",
                "create_token",
                "iota",
                "broadcasted_iota",
                "full",
                "empty",
                "rng_uniform",
            ]
        ]
        + [
            f"jnp.{n}"
            for n in [
                "arange",
                "bartlett",
                "blackman",
                "diag_indices",
                "empty",
                "eye",
                "hamming",
                "hanning",
                "identity",
                "indices",
                "mask_indices",
                "ones",
                "tri",
                "tril_indices",
                "triu_indices",
                "zeros",
                "fromfunction",
            ]
        ],
        _NO_ARRAY,
    ),
    **dict.fromkeys(
        [
            f"lax.{n}"
            for n in [
                "broadcast_shapes",
                "conv_dimension_numbers",
                "conv_general_permutations",
                "conv_general_shape_tuple",
                "conv_shape_tuple",
                "conv_transpose_shape_tuple",
                "padtype_to_pads",
                "reduce_window_shape_tuple",
                "shape_as_value",
            ]
        ]
        + ["jnp.broadcast_shapes"],
        _SHAPES,
    ),
    **dict.fromkeys(
        ["lax.dtype"]
        + [f"jnp.{n}" for n in ["can_cast", "isdtype", "issubdtype", "promote_types"]],
        _DTYPES,
    ),
    **dict.fromkeys(
        [
            f"jnp.{n}"
            for n in [
                "load",
                "save",
                "savez",
                "fromfile",
                "frombuffer",
                "fromiter",
                "fromstring",
                "get_printoptions",
                "set_printoptions",
                "printoptions",
                "array_repr",
                "array_str",
            ]
        ],
        _IO,
    ),
    "jnp.from_dlpack": "imports a foreign DLPack buffer; a traced value has none",
    "jnp.einsum_path": "plans a contraction order from shapes; computes no array",
    "lax.dce_sink": "internal: keeps a value alive against dead-code elimination",
    "nn.get_scaled_dot_general_config": "returns a configuration object for a mode",
}

_JAX_FAILS = "fails in plain JAX on a one-device CPU test machine, without quax: "
UNSUPPORTED: dict[str, str] = {
    "lax.psend": _JAX_FAILS + "has no `vmap` rule, and under a one-device `shard_map` "
    "its token type is rejected (AttributeError: 'AbstractToken' has no 'mat')",
    "lax.precv": _JAX_FAILS
    + "has no `vmap` rule and needs a peer device to receive from",
    "lax.pbroadcast": _JAX_FAILS
    + "its `vmap` rule raises TypeError, and under `shard_map` "
    "XLA:CPU has no lowering for it (on a `lax.pcast` varying operand)",
    "lax.ragged_all_to_all": _JAX_FAILS
    + "XLA:CPU does not implement `ragged-all-to-all`",
    "nn.scaled_matmul": _JAX_FAILS + "JAX lowers `scaled_matmul` for GPU only",
    "jnp.trim_zeros": "its output shape depends on the values and it has no `size=` "
    "argument, so it fails under any trace, as under `jax.jit`",
}


def _non_function_reason(obj: Any) -> str | None:
    """Why a public name that is not a function has nothing to test, or `None`."""
    if isinstance(obj, types.ModuleType):
        return "a submodule"
    if isinstance(obj, Primitive):
        return "a primitive: tested through the function that binds it"
    if isinstance(obj, type):
        return "a class, dtype or scalar type"
    if type(obj).__module__ in ("typing", "types"):
        return "a type annotation alias"
    if not callable(obj):
        return "a constant or an indexing helper object"
    return None


for _module, _mod in MODULES.items():
    for _name in dir(_mod):
        if not _name.startswith("_"):
            _reason = _non_function_reason(getattr(_mod, _name))
            if _reason is not None:
                NOT_APPLICABLE[f"{_module}.{_name}"] = _reason


# Tests --------------------------------------------------------------------------------


def _public_names() -> set[str]:
    return {
        f"{module}.{name}"
        for module, mod in MODULES.items()
        for name in dir(mod)
        if not name.startswith("_")
    }


def test_every_public_name_is_accounted_for() -> None:
    names = _public_names()
    tested, skipped, failing = set(CASES), set(NOT_APPLICABLE), set(UNSUPPORTED)
    assert tested & skipped == set()
    assert tested & failing == set()
    assert skipped & failing == set()
    assert names - tested - skipped - failing == set(), "new public JAX names"
    assert (tested | skipped | failing) - names == set(), "names JAX no longer has"
    assert all(NOT_APPLICABLE.values()) and all(UNSUPPORTED.values())


def _compare(got: Any, expected: Any) -> None:
    got_leaves, got_tree = jtu.tree_flatten(got)
    exp_leaves, exp_tree = jtu.tree_flatten(expected)
    assert got_tree == exp_tree
    for g, e in zip(got_leaves, exp_leaves, strict=True):
        if isinstance(e, jax.Array | np.ndarray | np.generic):
            assert jnp.shape(g) == jnp.shape(e)
            assert jnp.result_type(g) == jnp.result_type(e)
            # Against plain JAX on the same backend, through other programs: within
            # the backend's accuracy (a TPU's float32 `exp` and `log` are good to
            # about 1e-5).
            tol = quax.testing.tolerance(jnp.result_type(e))
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), **tol)
        else:
            assert g == e


@pytest.mark.parametrize("name", sorted(CASES))
def test_function(name: str) -> None:
    fn, args = CASES[name]
    try:
        expected = fn(*args)
    except NotImplementedError as e:
        # Plain JAX has no lowering of it for this backend (`eig` on a TPU): there is
        # nothing for quax to reproduce there.
        if "not found for platform" not in str(e):
            raise
        pytest.skip(f"plain JAX cannot run {name} on this backend: {e}")
    wrapped = jtu.tree_map(Dense, args)
    got = dense(quax.quaxify(fn)(*wrapped))
    _compare(got, expected)


# Entries of `UNSUPPORTED` that fail because of quax, not JAX: each must still fail,
# so that a fix shows up here and the function moves to `CASES`.
FAILING_CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "jnp.trim_zeros": (jnp.trim_zeros, (jnp.array([0.0, 1.0, 2.0, 0.0]),)),
}


def test_failing_cases_are_unsupported() -> None:
    assert set(FAILING_CASES) <= set(UNSUPPORTED)


@pytest.mark.parametrize("name", sorted(FAILING_CASES))
def test_unsupported_still_fails(name: str) -> None:
    fn, args = FAILING_CASES[name]
    fn(*args)  # plain JAX runs it
    with pytest.raises(Exception):  # noqa: B017 - any failure keeps it unsupported
        quax.quaxify(fn)(*jtu.tree_map(Dense, args))
