"""The types the rules return and a user can hold (`DeterminantLU` from
`lu_factor`, its solvers `ToeplitzLU`, `CirculantLU` and `KroneckerEigenLU`, the
`TridiagonalEigenvectors` of `eigh`, the `HalfSolved` of a first triangular
solve), rebuilt without their constructors (`eqx.tree_at`) with a field of another
shape, dtype or type, are refused by `quax.quaxify` before any rule reads them.
Before they had checks, `pivots` of shape `(1,)` read as a diagonal of one repeated
pivot (a wrong `det`), the eigenvalues of two Kronecker factors swapped solved
another system, a `Toeplitz` in a `CirculantLU` was solved as a circulant, factors
of another size gave their own determinant, and integer eigenvectors or an integer
`HalfSolved` gave truncated solutions: silently. Others crashed in
JAX with messages that named none of the fields."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
import quax
import quax_structured as qs
from jax import lax


N = 5
RNG = np.random.default_rng(0)
LOWER, MAIN, UPPER = RNG.standard_normal((3, N)).astype(np.float32)
MAIN += 4
COLUMN = RNG.standard_normal(N).astype(np.float32)
COLUMN[0] += 5
ROW = RNG.standard_normal(N).astype(np.float32)
ROW[0] = COLUMN[0]
A = np.array([[2.0, 0.5], [0.5, 1.5]], np.float32)
B = np.array([[3.0, 0.2, 0.1], [0.2, 2.0, 0.3], [0.1, 0.3, 1.0]], np.float32)


def tridiagonal() -> qs.TridiagonalMatrix:
    return qs.TridiagonalMatrix(LOWER[1:], MAIN, UPPER[1:])


def toeplitz() -> qs.Toeplitz:
    return qs.Toeplitz(COLUMN, ROW)


def circulant() -> qs.Circulant:
    return qs.Circulant(ROW[::-1].copy())


def kronecker() -> qs.KroneckerPlusIdentity:
    return qs.KroneckerPlusIdentity(A, B, jnp.float32(0.5))


MATRICES = {
    "tridiagonal": tridiagonal,
    "toeplitz": toeplitz,
    "circulant": circulant,
    "kronecker": kronecker,
}


def dense(m: qs.StructuredMatrix) -> np.ndarray:
    return np.asarray(m.enable_materialise().dense())


def factor(m: qs.StructuredMatrix):
    return quax.quaxify(jsl.lu_factor)(m)


def lu_solve(lu, piv, b):
    return jsl.lu_solve((lu, piv), b)


def det(lu, piv):
    del piv
    return jnp.prod(jnp.diagonal(lu))


def _other_tridiagonal() -> qs.TridiagonalMatrix:
    return qs.TridiagonalMatrix(LOWER[:2], MAIN[:3], UPPER[:2])


def _swap(name: str, where, leaf):
    """The `lu_factor` of `MATRICES[name]` with `where` replaced by `leaf(old)`."""

    def make():
        lu, piv = factor(MATRICES[name]())
        return eqx.tree_at(where, lu, leaf(where(lu))), piv

    return make


# Each rebuild, and what it did before the checks: "silent" (a wrong number from
# one of the programs below), "crash" (an error from JAX naming no field).
SWAPS = {
    # silent: the diagonal read pivot 0 for every row (a wrong `det`).
    "DeterminantLU pivots (1,)": (
        "DeterminantLU",
        _swap("tridiagonal", lambda lu: lu.pivots, lambda p: p[:1]),
    ),
    # silent: the last row read the pivot before it.
    "DeterminantLU pivots short": (
        "DeterminantLU",
        _swap("toeplitz", lambda lu: lu.pivots, lambda p: p[:-1]),
    ),
    # silent: a float16 diagonal, rounded.
    "DeterminantLU pivots float16": (
        "DeterminantLU",
        _swap("tridiagonal", lambda lu: lu.pivots, lambda p: p.astype(jnp.float16)),
    ),
    # crash: `lu_solve` solved with the 3 x 3 matrix (`det` read the factors).
    "DeterminantLU matrix of another size": (
        "DeterminantLU",
        _swap("circulant", lambda lu: lu.matrix, lambda m: _other_tridiagonal()),
    ),
    # silent: the det of the 3 x 3 factors (121 for 1011); `lu_solve` crashed.
    "DeterminantLU factors of another size": (
        "DeterminantLU",
        _swap("tridiagonal", lambda lu: lu.factors, lambda f: _other_tridiagonal()),
    ),
    # crash: a dense array has no `aval`.
    "DeterminantLU factors dense": (
        "DeterminantLU",
        _swap("tridiagonal", lambda lu: lu.factors, lambda f: jnp.eye(N)),
    ),
    # accepted: `ToeplitzLU.pivots()` returns the short `values` (the programs
    # here read the `DeterminantLU`'s own pivots, and stayed right).
    "ToeplitzLU values short": (
        "ToeplitzLU",
        _swap("toeplitz", lambda lu: lu.factors.values, lambda v: v[:-1]),
    ),
    # crash: a `Circulant` has no `row`.
    "ToeplitzLU matrix circulant": (
        "ToeplitzLU",
        _swap("toeplitz", lambda lu: lu.factors.matrix, lambda m: circulant()),
    ),
    # silent: the `Toeplitz`'s column solved as a circulant's.
    "CirculantLU matrix toeplitz": (
        "CirculantLU",
        _swap("circulant", lambda lu: lu.factors.matrix, lambda m: toeplitz()),
    ),
    # silent: the eigenvalues of the 2 x 2 and 3 x 3 factors swapped (size 6 both
    # ways) solved another system.
    "KroneckerEigenLU values swapped": (
        "KroneckerEigenLU",
        _swap("kronecker", lambda lu: lu.factors.values, lambda v: v[::-1]),
    ),
    # silent: one factor's eigenvalues broadcast over the diagonal.
    "KroneckerEigenLU values of one factor": (
        "KroneckerEigenLU",
        _swap("kronecker", lambda lu: lu.factors.values, lambda v: v[:1]),
    ),
    # crash: a reshape of the rotated right-hand side.
    "KroneckerEigenLU vectors (1, 3)": (
        "KroneckerEigenLU",
        _swap("kronecker", lambda lu: lu.factors.vectors[1], lambda v: v[:1]),
    ),
    # silent: the eigenvectors truncated to integers, `lu_solve` gave zeros.
    "KroneckerEigenLU vectors integer": (
        "KroneckerEigenLU",
        _swap(
            "kronecker",
            lambda lu: lu.factors.vectors[0],
            lambda v: v.astype(jnp.int32),
        ),
    ),
}


def _assert_refused(name: str, f, *args) -> None:
    with pytest.raises(ValueError) as info:
        f(*args)
    message = str(info.value)
    assert f"quax met a `{name}` whose fields break its own checks" in message
    assert "constructor" in message and "eqx.tree_at" in message


@pytest.mark.parametrize("swap", SWAPS, ids=list(SWAPS))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_inconsistent_factors_are_refused(swap, jit) -> None:
    name, make = SWAPS[swap]
    lu, piv = make()
    b = jnp.arange(1.0, piv.shape[-1] + 1)
    for program in (lambda lu, piv: lu_solve(lu, piv, b), det):
        f = quax.quaxify(program)
        f = jax.jit(f) if jit else f
        _assert_refused(name, f, lu, piv)


def test_eigenvectors_of_another_type_are_refused() -> None:
    # `eigh` of a `TridiagonalMatrix`: the eigenvectors stand for its own.
    _, vectors = quax.quaxify(jnp.linalg.eigh)(tridiagonal())
    assert isinstance(vectors, qs.TridiagonalEigenvectors)
    # Before: the `Toeplitz`'s shape read as the eigenvectors'.
    bad = eqx.tree_at(lambda v: v.matrix, vectors, toeplitz())
    for jit in (False, True):
        f = quax.quaxify(lambda v: jnp.zeros(v.shape))
        f = jax.jit(f) if jit else f
        _assert_refused("TridiagonalEigenvectors", f, bad)
    out = quax.quaxify(lambda v: jnp.zeros(v.shape))(vectors)
    assert out.shape == (N, N)


def _first_half(lu, b):
    return lax.linalg.triangular_solve(
        lu, b, left_side=True, lower=True, unit_diagonal=True
    )


def _second_half(lu, half):
    return lax.linalg.triangular_solve(lu, half, left_side=True, lower=False)


def test_half_solved_rebuilt_is_refused_and_kept_one_runs() -> None:
    m = tridiagonal()
    lu, _ = factor(m)
    b = np.arange(1.0, N + 1, dtype=np.float32)[:, None]
    half = quax.quaxify(_first_half)(lu, b)
    assert isinstance(half, qs.HalfSolved)
    want = np.linalg.solve(dense(m), b)
    # Held between the two solves, as built: the solution.
    out = quax.quaxify(_second_half)(lu, half)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    out = jax.jit(quax.quaxify(_second_half))(lu, half)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    for leaf in (
        # silent: returned truncated to integers (zeros here), or in float16.
        half.solution.astype(jnp.int32),
        half.solution.astype(jnp.float16),
        # refused before only by the second solve, as a materialisation.
        half.solution[:-1],
    ):
        bad = eqx.tree_at(lambda h: h.solution, half, leaf)
        for jit in (False, True):
            f = quax.quaxify(_second_half)
            f = jax.jit(f) if jit else f
            _assert_refused("HalfSolved", f, lu, bad)


def _batched(name: str) -> qs.StructuredMatrix:
    """Two matrices of structure `name` stacked on a leading batch axis."""
    if name == "tridiagonal":
        return qs.TridiagonalMatrix(
            np.stack([LOWER[1:], UPPER[1:]]),
            np.stack([MAIN, MAIN + 1]),
            np.stack([UPPER[1:], LOWER[1:]]),
        )
    if name == "toeplitz":
        return qs.Toeplitz(np.stack([COLUMN, COLUMN + 1]), np.stack([ROW, ROW + 1]))
    return qs.Circulant(np.stack([ROW[::-1], COLUMN]))


@pytest.mark.parametrize("name", MATRICES, ids=list(MATRICES))
def test_every_factorisation_route_passes(name) -> None:
    m = MATRICES[name]()
    a = dense(m)
    n = a.shape[-1]
    b = np.arange(1.0, n + 1, dtype=np.float32)
    for f in (factor, jax.jit(factor)):
        lu, piv = f(m)
        # The factors a rule built, boxed again by the next quaxify.
        out = quax.quaxify(lu_solve)(lu, piv, b)
        np.testing.assert_allclose(out, np.linalg.solve(a, b), rtol=1e-4)
        out = jax.jit(quax.quaxify(det))(lu, piv)
        np.testing.assert_allclose(out, np.linalg.det(a), rtol=1e-4)
        # An optimiser-like update that keeps shapes and dtypes passes too.
        same = jax.tree.map(lambda x: x, lu)
        out = quax.quaxify(lu_solve)(same, piv, b)
        np.testing.assert_allclose(out, np.linalg.solve(a, b), rtol=1e-4)


@pytest.mark.parametrize("name", ["tridiagonal", "toeplitz", "circulant"])
def test_batched_factorisations_and_their_vmap_views_pass(name) -> None:
    m = _batched(name)
    a = dense(m)
    b = np.stack([np.arange(1.0, N + 1), np.arange(N, 0.0, -1)]).astype(np.float32)
    want = np.linalg.solve(a, b[..., None])[..., 0]
    lu, piv = factor(m)
    # The batched factors whole, and `jax.vmap`'s view of each (leading axes
    # removed from every leaf), in both orders with quaxify.
    out = quax.quaxify(jax.vmap(lu_solve))(lu, piv, b)
    np.testing.assert_allclose(out, want, rtol=1e-4)
    out = jax.vmap(quax.quaxify(lu_solve))(lu, piv, b)
    np.testing.assert_allclose(out, want, rtol=1e-4)
    out = jax.jit(jax.vmap(quax.quaxify(det)))(lu, piv)
    np.testing.assert_allclose(out, np.linalg.det(a), rtol=1e-4)
    # Factored under `jax.vmap` (a view of the batched matrix per example).
    lu, piv = jax.vmap(factor)(m)
    out = jax.vmap(quax.quaxify(lu_solve))(lu, piv, b)
    np.testing.assert_allclose(out, want, rtol=1e-4)
