"""`quax.testing`'s conformance kit on every structure: `quax.quaxify(fn)` against
`fn` on the dense matrices (the structure's own `dense()`, plain JAX), under eval,
`jit`, both `vmap`s, `grad` and `jvp` (the derivatives at finite entries), with
hypothesis drawing the entries (NaN, infinities and -0.0 among them, but for the
FFT structures: see `FFT`), the function and the way the arguments are passed
(each its own value, one value twice, two values of one array, values built
inside the function); and the kit's threaded check."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing
import quax.testing.strategies as qst
import quax_structured as qs
from hypothesis import given, settings, strategies as st


# Examples per test: each runs every check of the kit (about six compilations, 1-12 s
# each). QUAX_HYPOTHESIS_SCALE (see scripts/hypothesis_sweep.sh) multiplies them.
SCALE = int(os.environ.get("QUAX_HYPOTHESIS_SCALE", "1"))
EXAMPLES = 10 * SCALE
# The factorisations draw 8 (at 10 they were the suite's slowest test, 62 s in CI):
# at the fixed seed 0 their examples reach the same 7 of the 8 structures (all but
# `Diagonal`) and all three solves as 10 did (9 and 8 examples: the same; 7 leave
# `Circulant` out, 6 `Toeplitz` too).
FACTORISATION_EXAMPLES = 8 * SCALE
N = 4

# How each structure is built from one array (`make`), and that array's shape.
MAKERS = {
    "TridiagonalMatrix": (
        (3, N),
        lambda x: qs.TridiagonalMatrix(x[0, :-1], x[1], x[2, :-1]),
    ),
    "Diagonal": ((N,), qs.Diagonal),
    "LowerTriangular": ((N, N), qs.LowerTriangular),
    "UpperTriangular": ((N, N), qs.UpperTriangular),
    "LowRank": ((N, 2), qs.LowRank),
    "LowRankPlusDiagonal": (
        (N, 3),
        lambda x: qs.LowRankPlusDiagonal(x[:, 0], x[:, 1:]),
    ),
    "Kronecker": ((2, 2, 2), lambda x: qs.Kronecker(x[0], x[1])),
    "Banded": ((4, N), lambda x: qs.Banded(x, 1, 2)),
    "BlockDiagonal": ((2, 2, 2), qs.BlockDiagonal),
    "Circulant": ((N,), qs.Circulant),
    "Toeplitz": ((2, N), lambda x: qs.Toeplitz(x[0], x[1])),
}

V = jnp.linspace(-1.0, 2.0, N)

# Their products go through the FFT, which mixes every entry: a NaN or infinite
# entry makes every entry of the product NaN, where dense JAX gives NaN only in
# the rows that read it (never a finite number where dense has NaN; see the
# Limits on its documentation page). They draw finite entries.
FFT = {"Circulant", "Toeplitz"}

# A product of two structures keeps each one's zeros: a NaN or infinite entry of one
# meets the other's structural zeros as zero, where dense JAX's `0 * nan` makes its
# whole row or column NaN (as `jax.experimental.sparse` keeps sparse x sparse; see
# the Limits on its documentation page). It draws finite entries.
STRUCTURAL_PRODUCTS = {"matrix product"}

# A `Kronecker` is itself a product of two structures, its factors, and keeps each
# one's zeros the same way: an infinite entry of one factor meets a zero of the other
# as zero (`kron_apply` multiplies by the factors in turn), where the dense Kronecker
# matrix holds `0 * inf = nan`; its products then give inf where dense JAX gives NaN
# (see the Limits on its documentation page). It draws finite entries.
FACTORED = {"Kronecker"}

# Functions of two matrices that every structure keeps or computes exactly, and
# whether the kit's `quaxify(vmap)` check runs on them: `LowRank`,
# `LowRankPlusDiagonal` and `Kronecker` have no batch axes (a stack of them
# refuses; `tests/test_batched_conj.py` covers the batched products of the
# others), so the products run every check but that one (`vmap=False` also drops
# `vmap(quaxify)`, which the sums keep).
FUNCTIONS = {
    "product with a vector": (lambda a, b: a @ V + b.T @ V, False),
    "matrix product": (lambda a, b: a @ b, False),
    "sum": (lambda a, b: a + b, True),
    "scaled difference": (lambda a, b: 2.5 * a - b / 2, True),
    "diagonal and trace": (lambda a, b: jnp.diagonal(a) + jnp.trace(b), True),
    "transpose": (lambda a, b: (a.T + b) @ V, False),
}


def _reference(fn, make):
    """`fn` on the dense matrices the arrays stand for (plain JAX)."""
    return lambda *xs: fn(*(make(x).enable_materialise().dense() for x in xs))


@pytest.mark.long_running
@settings(max_examples=EXAMPLES, deadline=None)
@given(
    kind=st.sampled_from(sorted(MAKERS)),
    name=st.sampled_from(sorted(FUNCTIONS)),
    data=st.data(),
)
def test_structures_match_dense_with_non_finite_entries(kind, name, data):
    """NaN in, NaN out, where dense JAX puts it; the right numbers elsewhere."""
    shape, make = MAKERS[kind]
    fn, vmap = FUNCTIONS[name]
    call = data.draw(
        qst.calls(
            fn,
            make,
            qst.arrays(
                shape,
                non_finite=kind not in FFT | FACTORED
                and name not in STRUCTURAL_PRODUCTS,
            ),
            kinds=("values", "aliased", "shared arrays", "built inside"),
        )
    )
    reference = _reference(fn, make) if call.kind == "built inside" else None
    # Derivatives only at finite entries: where a leaf holds a NaN, dense JAX's
    # gradient is NaN also for entries the output does not depend on (its
    # reverse pass multiplies zero cotangents by the dense matrix: `0 * nan`),
    # where the structure's is exactly zero (e.g. `jnp.diagonal` of a
    # `Kronecker` reads only the factors' diagonals). The values, `jit` and
    # `vmap` are compared at every entry.
    finite = all(
        bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(call.args)
    )
    # The comparison subtracts infinities of the same sign before it accepts
    # them as equal, which NumPy warns about (and warnings are errors).
    with np.errstate(invalid="ignore"):
        quax.testing.assert_matches_dense(
            call.fn,
            *call.args,
            reference=reference,
            vmap=vmap,
            grad=finite,
            jvp=finite,
            rtol=1e-4,
            atol=1e-4,
        )


# Factorisations, on finite, well-conditioned matrices: each array with 4 added
# where it holds the main diagonal (a dominant diagonal).
DOMINANT = {
    "TridiagonalMatrix": lambda x: x.at[1].add(4.0),
    "Diagonal": lambda x: x + 4.0,
    "LowerTriangular": lambda x: x + 4.0 * jnp.eye(N),
    "UpperTriangular": lambda x: x + 4.0 * jnp.eye(N),
    "Banded": lambda x: x.at[1].add(4.0),
    "BlockDiagonal": lambda x: x + 4.0 * jnp.eye(2),
    "Circulant": lambda x: x.at[0].add(4.0),
    "Toeplitz": lambda x: x.at[:, 0].set(x[0, 0] + 4.0),
}
SOLVES = {
    "solve": lambda a: jnp.linalg.solve(a, V),
    "slogdet": lambda a: jnp.linalg.slogdet(a)[1],
    "det": jnp.linalg.det,
}


@pytest.mark.long_running
@settings(max_examples=FACTORISATION_EXAMPLES, deadline=None)
@given(
    kind=st.sampled_from(sorted(DOMINANT)),
    name=st.sampled_from(sorted(SOLVES)),
    data=st.data(),
)
def test_factorisations_match_dense(kind, name, data):
    shape, make = MAKERS[kind]
    x = data.draw(qst.arrays(shape, min_value=-0.5, max_value=0.5))
    m = make(DOMINANT[kind](x))
    quax.testing.assert_matches_dense(SOLVES[name], m, rtol=1e-3, atol=1e-3)


@pytest.mark.long_running
# Banded, Circulant, LowRank and UpperTriangular repeat, with rules of the same
# shape, what the other seven check (and cost 3-30 s each): sweeps
# (`bash scripts/test.sh sweeps`).
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(kind, marks=pytest.mark.sweep)
        if kind in ("Banded", "Circulant", "LowRank", "UpperTriangular")
        else kind
        for kind in sorted(MAKERS)
    ],
)
def test_thread_safe(kind):
    """Threads calling one function on one structure, eagerly and jitted, all
    get the single-threaded answer."""
    shape, make = MAKERS[kind]
    m = make(jnp.arange(1.0, 1.0 + np.prod(shape)).reshape(shape) / 10)
    quax.testing.assert_thread_safe(
        lambda a: a @ V + 2 * (a.T @ V), m, threads=4, calls=2
    )
