"""The fallbacks of `LowRankPlusDiagonal`'s checked solve and determinant, in NumPy
and LAPACK, for the host (`checked_or_fallback` runs them on the CPU backend
through a custom call), on the arrays XLA hands over: the candidates of the
fallbacks the program runs (`_values/_lowrank.py`'s `_solve_fallback` and
`_determinant_fallback`) and the same choice between them, except that the LU
pivots within blocks of `BLOCK` rows (`_block_lu`) where the program's runs
without pivoting, row by row: as accurate wherever that one is, and 64 times
fewer Python steps than a row at a time (which took 10 ms at n = 256 and a
second at n = 16,384, with other work on the machine). They never run a JAX
computation (only `jnp.finfo` is read): a custom call runs inside one of XLA's
CPU threads, and a JAX computation started from there can wait for that thread
(two Python threads taking the fallback at once deadlocked when the host ran
the fallback as a compiled JAX program).

Each function takes the leaves of its JAX twin's arguments in `jax.tree.leaves`
order (the fast answer first, then the matrix's `diag`, `u` and, where it has
one, `v`, then the rest) and returns an array of the fast answer's shape and
dtype."""

import jax.numpy as jnp
import numpy as np


__all__ = ["host_determinant_fallback", "host_solve_fallback"]


def host_solve_fallback(
    woodbury: np.ndarray, *leaves: np.ndarray, tolerance: float
) -> np.ndarray:
    """`_solve_fallback` in NumPy: `leaves` are `diag`, `u`, `v` where the matrix
    has one, and `b` (shape `(n, k)`); `woodbury` is Woodbury's answer (shape
    `(n,)` for one right-hand side, else `(n, k)`). The block LU (`_block_lu`)
    and Woodbury with the capacitance partially pivoted (where the
    matrix is symmetric and real, `woodbury` solved it by Cholesky, which may
    have failed; otherwise `woodbury` already pivoted), the answer of the
    smaller backward error, NaN where neither is below `tolerance · eps`.

    **Arguments:**

    - `woodbury`: Woodbury's answer, which failed its check.
    - `leaves`: `diag`, `u`, `v` (if any) and `b`.
    - `tolerance`: the largest backward error, relative to `eps`, returned.

    **Returns:**

    An array of `woodbury`'s shape and dtype.
    """
    diag, u, v, b = _unpack(leaves)
    dtype = woodbury.dtype
    with np.errstate(all="ignore"):
        work = _working(dtype)
        diag, u, b = diag.astype(work), u.astype(work), b.astype(work)
        v = None if v is None else v.astype(work)
        if v is None and not np.issubdtype(dtype, np.complexfloating):
            pivoted = _pivoted_woodbury(diag, u, u, b)
        else:
            pivoted = woodbury.astype(work).reshape(b.shape)
        candidates = [_block_lu(diag, u, u if v is None else v, b)[0], pivoted]
        out = _best(diag, u, v, b, candidates, candidates, dtype, tolerance)
    return out.reshape(woodbury.shape).astype(dtype)


def host_determinant_fallback(
    lemma: np.ndarray, *leaves: np.ndarray, tolerance: float
) -> np.ndarray:
    """`_determinant_fallback` in NumPy: `leaves` are `diag`, `u`, `v` where the
    matrix has one, and Woodbury's solve of the probe `x₀ = cos(1.618 k)`;
    `lemma` holds the `n + r` factors of the determinant lemma whose solve
    failed its check. Candidates: the block LU's `n` numbers (`_block_lu`, and
    `r` ones), and the lemma (with the capacitance partially pivoted where the
    matrix is symmetric and real: `r - 1` ones and `det K`), whichever solves
    the probe with the smaller backward error (finite factors with a zero
    product count as exact), NaN where neither is below `tolerance · eps`.

    **Arguments:**

    - `lemma`: the determinant lemma's `n + r` factors.
    - `leaves`: `diag`, `u`, `v` (if any) and Woodbury's solve of the probe.
    - `tolerance`: the largest backward error, relative to `eps`, returned.

    **Returns:**

    An array of `lemma`'s shape and dtype.
    """
    diag, u, v, woodbury = _unpack(leaves)
    dtype = lemma.dtype
    n, r = u.shape
    with np.errstate(all="ignore"):
        work = _working(dtype)
        probe = np.cos(1.618 * np.arange(n)).astype(dtype).astype(work)[:, None]
        diag, u = diag.astype(work), u.astype(work)
        v = None if v is None else v.astype(work)
        lu_solve, pivots = _block_lu(diag, u, u if v is None else v, probe)
        ones = np.ones(max(r - 1, 0), work)
        solves = [lu_solve, woodbury.astype(work).reshape(n, 1)]
        answers = [np.concatenate([pivots, ones, np.ones(1, work)]), lemma.astype(work)]
        if v is None and not np.issubdtype(dtype, np.complexfloating) and r > 0:
            solves[1] = _pivoted_woodbury(diag, u, u, probe)
            det = np.linalg.det(_woodbury_parts(diag, u, u)[1])
            answers[1] = np.concatenate([diag, ones, np.array([det], work)])
        out = _best(diag, u, v, probe, solves, answers, dtype, tolerance)
    return out.astype(dtype)


def _unpack(
    leaves: tuple[np.ndarray, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """`diag`, `u`, `v` (`None` for a symmetric matrix) and the last operand,
    from the matrix's leaves and that operand."""
    if len(leaves) == 3:
        diag, u, last = leaves
        return diag, u, None, last
    diag, u, v, last = leaves
    return diag, u, v, last


def _working(dtype: np.dtype) -> np.dtype:
    """The dtype the host computes in: `dtype`, or float32/complex64 for a
    narrower one, which LAPACK lacks."""
    return np.promote_types(dtype, np.float32)


def _woodbury_parts(
    diag: np.ndarray, u: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`D⁻¹ U` and the capacitance `K = I + Vᵀ D⁻¹ U`, as `_woodbury_parts` forms
    them."""
    scaled = u / diag[:, None]
    return scaled, np.eye(u.shape[1], dtype=u.dtype) + v.T @ scaled


def _pivoted_woodbury(
    diag: np.ndarray, u: np.ndarray, v: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """Woodbury's `A⁻¹ b` (`b` of shape `(n, k)`), its capacitance solved with
    partial pivoting; NaN where the capacitance is exactly singular (NumPy's
    solve raises there, and a singular matrix's determinant must still come
    out as 0 from the other candidate, not as NaN from an exception)."""
    scaled, capacitance = _woodbury_parts(diag, u, v)
    w = b / diag[:, None]
    if u.shape[1] == 0:
        return w
    try:
        inner = np.linalg.solve(capacitance, v.T @ w)
    except np.linalg.LinAlgError:
        return np.full_like(w, np.nan)
    return w - scaled @ inner


# Rows per block of the host's LU (`_block_lu`): each block costs a few NumPy and
# LAPACK calls (tens of µs) whatever its size up to here, so larger blocks mean
# fewer Python steps; the dense block work, O(n BLOCK²), stays below the
# O(n r²) of the rest for the ranks this is used at.
BLOCK = 64


def _block_lu(
    diag: np.ndarray, u: np.ndarray, v: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`A⁻¹ b` (`b` of shape `(n, k)`) for `A = D + U Vᵀ` by block Gaussian
    elimination, and `n` numbers whose product is `det A`.

    The Schur complement of a leading block of `D + U M Vᵀ` is again of that
    form (`D₂ + U₂ M' V₂ᵀ`, `M' = M - M V₁ᵀ A₁₁⁻¹ U₁ M`, `r x r`), so each block of
    `BLOCK` rows is a dense `A₁₁ = D₁ + U₁ M V₁ᵀ`, factored by LAPACK with
    partial pivoting (`getrf`) and solved with its factors; the right-hand
    side's elimination is carried as the `r x k` sum `Σ M V₁ᵀ A₁₁⁻¹ c₁`, the
    back substitution as `Σ V₂ᵀ x₂`. O(n (BLOCK + r)(r + k)) work in `n / BLOCK`
    steps. Where the program runs the semiseparable LU without pivoting
    (`BLOCK = 1`), this pivots within each block: the same answer where that LU
    is accurate, and also one where a leading minor of a block vanishes (the
    backward error check decides either way). The numbers for the determinant
    are the blocks' `getrf` diagonals, each block's first one carrying its
    permutation's sign."""
    import scipy.linalg.lapack

    n, r = u.shape
    m = np.eye(r, dtype=u.dtype)
    carried = np.zeros((r, b.shape[1]), np.result_type(u, b))
    # LAPACK itself, not `scipy.linalg.lu_factor`, which warns at an exact zero
    # pivot (a warning from one of XLA's threads, and an error under
    # `-W error`): a singular block gives infinite or NaN answers here, which
    # the backward errors reject.
    getrf, getrs = scipy.linalg.lapack.get_lapack_funcs(("getrf", "getrs"), (u,))
    blocks = []
    pivots = np.empty(n, u.dtype)
    for start in range(0, n, BLOCK):
        rows = slice(start, min(start + BLOCK, n))
        d1, u1, v1 = diag[rows], u[rows], v[rows]
        um = u1 @ m
        a11 = np.diag(d1) + um @ v1.T
        lu, perm, _ = getrf(a11, overwrite_a=True)
        rhs = np.concatenate([um, b[rows] - u1 @ carried], axis=1)
        solved, _ = getrs(lu, perm, rhs, overwrite_b=True)
        g, y = solved[:, :r], solved[:, r:]
        mv = m @ v1.T
        carried = carried + mv @ y
        m = m - mv @ g
        blocks.append((rows, g, y))
        diagonal = np.diagonal(lu).copy()
        if np.count_nonzero(perm != np.arange(len(perm))) % 2:
            diagonal[0] = -diagonal[0]
        pivots[rows] = diagonal
    x = np.empty_like(b, dtype=carried.dtype)
    behind = np.zeros_like(carried)
    for rows, g, y in reversed(blocks):
        x[rows] = y - g @ behind
        behind = behind + v[rows].T @ x[rows]
    return x, pivots


def _norm_bound(diag: np.ndarray, u: np.ndarray, v: np.ndarray | None) -> float:
    """`max |dᵢ| + ‖U‖_F ‖V‖_F`, an upper bound of `‖A‖₂` (`_norm_bound`)."""
    squares = [np.sum(np.real(f * f.conj())) for f in ([u] if v is None else [u, v])]
    frobenius = squares[0] if v is None else np.sqrt(squares[0] * squares[1])
    largest = np.max(np.abs(diag)) if diag.size else 0.0
    return float(largest + frobenius)


def _backward_error(
    diag: np.ndarray,
    u: np.ndarray,
    v: np.ndarray | None,
    x: np.ndarray,
    b: np.ndarray,
    norm: float,
) -> float:
    """`max_k ‖b_k - A x_k‖₂ / (‖A‖₂ ‖x_k‖₂ + ‖b_k‖₂)` with `‖A‖₂` bounded by `norm`,
    each column scaled by its `max |b|` (as `backward_error`); `inf` for NaN."""
    ax = diag[:, None] * x + u @ ((u if v is None else v).T @ x)
    big = np.max(np.abs(b), axis=0) if b.size else np.zeros(b.shape[1])
    scale = np.where(big > 0, big, 1)

    def size(y: np.ndarray) -> np.ndarray:
        y = y / scale
        return np.sqrt(np.sum(np.real(y * y.conj()), axis=0))

    errors = size(b - ax) / (norm * size(x) + size(b))
    error = float(np.max(errors)) if errors.size else 0.0
    return np.inf if np.isnan(error) else error


def _best(
    diag: np.ndarray,
    u: np.ndarray,
    v: np.ndarray | None,
    b: np.ndarray,
    solves: list[np.ndarray],
    answers: list[np.ndarray],
    dtype: np.dtype,
    tolerance: float,
) -> np.ndarray:
    """The answer whose solve has the smallest backward error (the first of
    equal ones), NaN where none is below `tolerance · eps` of `dtype`; an answer
    of finite factors with a zero product counts as exact (as `_best`)."""
    norm = _norm_bound(diag, u, v)
    out, least = answers[0], np.inf
    for i, (x, answer) in enumerate(zip(solves, answers, strict=True)):
        error = _backward_error(diag, u, v, x, b, norm)
        if answer is not x and np.prod(answer) == 0:
            error = 0.0
        if i == 0 or error < least:
            out, least = answer, error
    if least <= tolerance * float(jnp.finfo(dtype).eps):
        return out
    return np.full_like(out, np.nan)
