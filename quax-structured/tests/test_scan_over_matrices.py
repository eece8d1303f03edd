"""`lax.scan` and `lax.map` over a structured matrix. Over one matrix they take its
rows, which are no matrices of its type: the dense rows where materialising is
allowed (the dense program's answer), else a refusal that names the scan. Over a
stack of matrices (a batch axis) they take the matrices, which keep their
structure."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_structured as qs


N = 4

# The shape of the array each structure is built from (see `_matrix`).
SHAPES = {
    "TridiagonalMatrix": (3, N),
    "Diagonal": (N,),
    "LowerTriangular": (N, N),
    "UpperTriangular": (N, N),
    "LowRank": (N, 2),
    "LowRankPlusDiagonal": (N, 3),
    "Kronecker": (2, 2, 2),
    "Banded": (4, N),
    "BlockDiagonal": (2, 2, 2),
    "Circulant": (N,),
    "Toeplitz": (2, N),
}


def _matrix(kind, x, **kwargs):
    """The structure `kind` built from `x` (of shape `SHAPES[kind]`, after any
    batch axes)."""
    cls = getattr(qs, kind)
    if kind == "TridiagonalMatrix":
        return cls(x[..., 0, :-1], x[..., 1, :], x[..., 2, :-1], **kwargs)
    if kind == "LowRankPlusDiagonal":
        return cls(x[:, 0], x[:, 1:], **kwargs)
    if kind == "Kronecker":
        return cls(x[0], x[1], **kwargs)
    if kind == "Toeplitz":
        return cls(x[..., 0, :], x[..., 1, :], **kwargs)
    if kind == "Banded":
        return cls(x, 1, 2, **kwargs)
    return cls(x, **kwargs)


# The structures with batch axes (a stack of them is one value).
BATCHED = [
    "TridiagonalMatrix",
    "Diagonal",
    "LowerTriangular",
    "UpperTriangular",
    "Banded",
    "BlockDiagonal",
    "Circulant",
    "Toeplitz",
]


def _array(kind, seed=0):
    return jax.random.uniform(
        jax.random.PRNGKey(seed), SHAPES[kind], minval=-1, maxval=1
    )


def _dense(kind, x):
    """The dense matrix, written out independently of the structure's code."""
    x = np.asarray(x, np.float64)
    if kind == "TridiagonalMatrix":
        return np.diag(x[1]) + np.diag(x[0, :-1], -1) + np.diag(x[2, :-1], 1)
    if kind == "Diagonal":
        return np.diag(x)
    if kind == "LowerTriangular":
        return np.tril(x)
    if kind == "UpperTriangular":
        return np.triu(x)
    if kind == "LowRank":
        return x @ x.T
    if kind == "LowRankPlusDiagonal":
        return np.diag(x[:, 0]) + x[:, 1:] @ x[:, 1:].T
    if kind == "Kronecker":
        return np.kron(x[0], x[1])
    if kind == "Banded":
        # bands[d + 1, i] = A[i, i + d] for -1 <= d <= 2.
        out = np.zeros((N, N))
        for d in range(-1, 3):
            for i in range(N):
                if 0 <= i + d < N:
                    out[i, i + d] = x[d + 1, i]
        return out
    if kind == "BlockDiagonal":
        out = np.zeros((N, N))
        out[:2, :2], out[2:, 2:] = x[0], x[1]
        return out
    if kind == "Circulant":
        return np.array([[x[(i - j) % N] for j in range(N)] for i in range(N)])
    assert kind == "Toeplitz"
    column, row = x
    return np.array(
        [[column[i - j] if i >= j else row[j - i] for j in range(N)] for i in range(N)]
    )


def _map_rows(m):
    return jax.lax.map(lambda r: 2 * r + 1, m)


def _scan_rows(m):
    def step(c, r):
        return c + r, jnp.sum(r * r)

    return jax.lax.scan(step, jnp.zeros(N, m.dtype), m)


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest.mark.parametrize("jit", [False, True])
def test_scan_and_map_over_rows_give_the_dense_result(kind, jit):
    x = _array(kind)
    m = _matrix(kind, x, allow_materialise=True)
    dense = _dense(kind, x)
    wrap = jax.jit if jit else (lambda f: f)
    got = wrap(quax.quaxify(_map_rows))(m)
    np.testing.assert_allclose(got, 2 * dense + 1, rtol=1e-6, atol=1e-6)
    carry, ys = wrap(quax.quaxify(_scan_rows))(m)
    np.testing.assert_allclose(carry, dense.sum(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ys, (dense**2).sum(1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest.mark.parametrize("fn", [_map_rows, _scan_rows], ids=["map", "scan"])
def test_scan_over_rows_refuses_naming_the_scan(kind, fn):
    m = _matrix(kind, _array(kind))
    with pytest.raises(RuntimeError, match="Refusing to materialise") as info:
        quax.quaxify(fn)(m)
    assert "scanned-over input 0" in str(info.value)
    assert kind in str(info.value)


@pytest.mark.parametrize("kind", BATCHED)
def test_scan_over_a_stack_keeps_each_matrix(kind):
    """Over a batch axis each step gets one matrix of the structure: a solve runs
    with `allow_materialise=False`."""
    xs = jnp.stack([_array(kind, seed) for seed in range(3)])
    # A dominant diagonal, so that every matrix is well conditioned.
    eye = jnp.broadcast_to(4 * jnp.eye(N), (3, N, N))
    if kind in ("LowerTriangular", "UpperTriangular"):
        xs = xs + eye
    elif kind in ("TridiagonalMatrix", "Banded"):
        xs = xs.at[:, 1].add(4.0)
    elif kind == "Toeplitz":
        xs = xs.at[:, :, 0].set(xs[:, :1, 0] + 4.0)
    elif kind == "BlockDiagonal":
        xs = xs + 4 * jnp.eye(2)
    elif kind == "Circulant":
        xs = xs.at[:, 0].add(4.0)
    else:
        xs = xs + 4.0
    # Leaves of a stack: the structure built with batch axes.
    stack = _matrix(kind, xs)
    b = jnp.linspace(-1.0, 2.0, N)
    got = jax.jit(
        quax.quaxify(lambda s: jax.lax.map(lambda a: jnp.linalg.solve(a, b), s))
    )(stack)
    want = [np.linalg.solve(_dense(kind, xs[i]), b) for i in range(3)]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-4, atol=1e-5)
