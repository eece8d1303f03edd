"""`TridiagonalMatrix` and its O(n) algorithms."""

from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import jax.scipy.linalg
from jax import lax
from jaxtyping import Array

from .._kernels import (
    failed_factorisation,
    keep_or_scale,
    nan_where,
    on_diagonal,
    tridiagonal_solve,
)
from ._base import StructuredMaterialisationError, StructuredMatrix, sequence_as_array
from ._determinant import DeterminantLU


__all__ = ["TridiagonalEigenvectors", "TridiagonalMatrix"]


class TridiagonalMatrix(StructuredMatrix):
    """A tridiagonal matrix, stored as its three diagonals.

    As in the published quax: `T[..., i + 1, i] = lower_diag[..., i]`,
    `T[..., i, i] = main_diag[..., i]`, `T[..., i, i + 1] = upper_diag[..., i]`.
    Products cost O(n); `jnp.linalg.solve`, `slogdet` and `det` on it cost O(n):
    `solve` pivots (`pivoted_solve`), `slogdet` and `det` read the pivots of an LU
    without pivoting (see `lu`).

    **Fields:**

    - `lower_diag`: shape `(*batch, n - 1)`.
    - `main_diag`: shape `(*batch, n)`.
    - `upper_diag`: shape `(*batch, n - 1)`.
    - `allow_materialise`: whether an operation without a rule may form the dense
        `(*batch, n, n)` array (static, default `False`: it raises instead).
    """

    batch_leading = True

    lower_diag: Array
    main_diag: Array
    upper_diag: Array

    def __init__(
        self,
        lower_diag: Array,
        main_diag: Array,
        upper_diag: Array,
        allow_materialise: bool = False,
        *,
        positive_definite: bool = False,
    ):
        # The published quax's signature: `allow_materialise` may be positional.
        self.lower_diag = sequence_as_array(lower_diag)
        self.main_diag = sequence_as_array(main_diag)
        self.upper_diag = sequence_as_array(upper_diag)
        self.allow_materialise = allow_materialise
        self.positive_definite = positive_definite

    def __check_init__(self):
        expected = dict(
            lower_diag="(*batch, n - 1)",
            main_diag="(*batch, n)",
            upper_diag="(*batch, n - 1)",
        )
        shapes = {name: jnp.shape(getattr(self, name)) for name in expected}
        for name, shape in shapes.items():
            if len(shape) == 0:
                raise ValueError(
                    f"`TridiagonalMatrix` needs `{name}` of shape {expected[name]}, "
                    "an array of at least 1 dimension; got a scalar. The diagonals "
                    "do not broadcast (as in lineax's `TridiagonalLinearOperator`): "
                    "for a constant diagonal pass `jnp.full(length, value)`."
                )
        batches = {name: shape[:-1] for name, shape in shapes.items()}
        if len(set(batches.values())) != 1:
            raise ValueError(
                "Got inconsistent batch dimensions for `TridiagonalMatrix`: it "
                "needs the same batch axes on `lower_diag`, "
                "`main_diag` and `upper_diag` (shapes (*batch, n - 1), (*batch, n), "
                f"(*batch, n - 1)); got the shapes {tuple(shapes.values())}. "
                "Broadcast them to a common batch first."
            )
        n = shapes["main_diag"][-1]
        # An empty matrix (n = 0) has empty off-diagonals too.
        off = max(n - 1, 0)
        if shapes["lower_diag"][-1] != off or shapes["upper_diag"][-1] != off:
            raise ValueError(
                "Got inconsistent diagonal lengths for `TridiagonalMatrix`: it "
                "needs `lower_diag` and `upper_diag` one entry "
                f"shorter than `main_diag` (n - 1 = {off} for `main_diag` of "
                f"length n = {n}; 0 for an empty matrix); got the shapes "
                f"{tuple(shapes.values())} for `lower_diag`, `main_diag` and "
                "`upper_diag`."
            )
        dtypes = [jnp.result_type(getattr(self, name)) for name in expected]
        if len(set(dtypes)) != 1:
            raise ValueError(
                "Got inconsistent dtypes for `TridiagonalMatrix`: it needs "
                "`lower_diag`, `main_diag` and `upper_diag` of one dtype; got "
                f"{', '.join(map(str, dtypes))}. "
                "Convert them with `.astype(dtype)`."
            )

    def _with(self, lower: Array, main: Array, upper: Array) -> "TridiagonalMatrix":
        return TridiagonalMatrix(
            lower, main, upper, allow_materialise=self.allow_materialise
        )

    def aval(self) -> jax.core.ShapedArray:
        *batch, size = self.main_diag.shape
        return jax.core.ShapedArray((*batch, size, size), self.main_diag.dtype)

    def dense(self) -> Array:
        return (
            on_diagonal(self.main_diag)
            + on_diagonal(self.upper_diag, 1)
            + on_diagonal(self.lower_diag, -1)
        )

    # Structured operations (called by the rules) ------------------------------------

    def transpose(self) -> "TridiagonalMatrix":
        return TridiagonalMatrix(
            self.upper_diag,
            self.main_diag,
            self.lower_diag,
            allow_materialise=self.allow_materialise,
        )

    def map_leaves(self, fn) -> "TridiagonalMatrix":
        return TridiagonalMatrix(
            fn(self.lower_diag),
            fn(self.main_diag),
            fn(self.upper_diag),
            allow_materialise=self.allow_materialise,
        )

    def matmat(self, x: Array) -> Array:
        """`T @ x` for `x` of shape `(*batch, n, k)`, in O(n k)."""
        lower, main, upper = (
            d[..., None] for d in (self.lower_diag, self.main_diag, self.upper_diag)
        )
        pad = [(0, 0)] * (x.ndim - 2)
        out = main * x
        out = out + jnp.pad(upper * x[..., 1:, :], [*pad, (0, 1), (0, 0)])
        return out + jnp.pad(lower * x[..., :-1, :], [*pad, (1, 0), (0, 0)])

    def entries(self, i: Array, j: Array) -> Array:
        """`T[i, j]` for index arrays `i`, `j` (no batch axes), in O(len(i))."""
        n = self.main_diag.shape[-1]
        i, j = jnp.clip(i, 0, n - 1), jnp.clip(j, 0, n - 1)
        k = jnp.minimum(i, j).clip(0, n - 2)
        zero = jnp.zeros((), self.dtype)
        if n == 1:  # no off-diagonal entries to index
            return jnp.where(i == j, self.main_diag[i], zero)
        off = jnp.where(j == i + 1, self.upper_diag[k], zero)
        off = jnp.where(i == j + 1, self.lower_diag[k], off)
        return jnp.where(i == j, self.main_diag[i], off)

    def masked(self, y: Array, *, select: bool = False) -> "TridiagonalMatrix":
        lower, main, upper = (
            keep_or_scale(leaf, jnp.diagonal(y, k, -2, -1), select=select)
            for leaf, k in (
                (self.lower_diag, -1),
                (self.main_diag, 0),
                (self.upper_diag, 1),
            )
        )
        return self._with(lower, main, upper)

    def add(self, other: StructuredMatrix) -> "TridiagonalMatrix | None":
        if isinstance(other, TridiagonalMatrix):
            return TridiagonalMatrix(
                self.lower_diag + other.lower_diag,
                self.main_diag + other.main_diag,
                self.upper_diag + other.upper_diag,
                allow_materialise=self.allow_materialise,
            )
        return None

    def add_diagonal(self, d: Array) -> "TridiagonalMatrix":
        return TridiagonalMatrix(
            self.lower_diag,
            self.main_diag + d,
            self.upper_diag,
            allow_materialise=self.allow_materialise,
        )

    def row_scaled(self, d: Array) -> "TridiagonalMatrix":
        return TridiagonalMatrix(
            self.lower_diag * d[..., 1:],
            self.main_diag * d,
            self.upper_diag * d[..., :-1],
            allow_materialise=self.allow_materialise,
        )

    def col_scaled(self, d: Array) -> "TridiagonalMatrix":
        return TridiagonalMatrix(
            self.lower_diag * d[..., :-1],
            self.main_diag * d,
            self.upper_diag * d[..., 1:],
            allow_materialise=self.allow_materialise,
        )

    def cholesky(self) -> "TridiagonalMatrix":
        """The lower bidiagonal Cholesky factor (a tridiagonal matrix with a zero
        upper diagonal), from the lower triangle, O(n). NaN on its two diagonals
        where the matrix is not positive definite (dense JAX: the whole lower
        triangle; the entries outside the band stay the structure's zeros)."""

        def step(l_prev, x):
            a, m = x
            off = a / l_prev
            l_next = jnp.sqrt(m - off * off)
            return l_next, (off, l_next)

        a, m = (jnp.moveaxis(v, -1, 0) for v in (self.lower_diag, self.main_diag))
        first = jnp.sqrt(m[0])
        _, (off, rest) = lax.scan(step, first, (a, m[1:]))
        main = jnp.moveaxis(jnp.concatenate([first[None], rest]), 0, -1)
        # As dense JAX: where the matrix is not positive definite, the whole factor
        # (its stored lower entries) is NaN.
        failed = failed_factorisation(main)
        return self._with(
            nan_where(failed, jnp.moveaxis(off, 0, -1)),
            nan_where(failed, main),
            jnp.zeros_like(self.upper_diag),
        )

    def lu(self) -> DeterminantLU:
        """The packed LU factors without pivoting (the Thomas algorithm): a
        tridiagonal matrix whose strict lower part is `L - I` and whose upper part is
        `U`, O(n), with the identity permutation. `slogdet` and `det` read their
        pivots (see `_pivots`). `lu_solve` does not solve with them (a tiny pivot
        of a well-conditioned matrix would lose every digit): its first triangular
        solve does the whole solve with partial pivoting (`pivoted_solve`), the
        second returns it (see `HalfSolved`)."""

        def step(u_prev, x):
            a, d, c = x
            m = a / u_prev
            u = d - m * c
            return u, (m, u)

        a, d, c = (jnp.moveaxis(v, -1, 0) for v in self._diags())
        _, (m, u) = lax.scan(step, d[0], (a, d[1:], c))
        u = jnp.concatenate([d[:1], u])
        factors = TridiagonalMatrix(
            jnp.moveaxis(m, 0, -1),
            jnp.moveaxis(u, 0, -1),
            self.upper_diag,
            allow_materialise=self.allow_materialise,
        )
        return DeterminantLU(factors, self, pivots=self._pivots(factors.main_diag))

    def _pivots(self, u: Array) -> Array:
        """Numbers whose product is `det T`, from the Thomas pivots `u`: where a
        pivot `u_k` (not the last) is exactly zero, the next one is infinite (or
        NaN), but `θ_{k+1} = -lower_k upper_k θ_{k-1}` (the leading minors `θ`):
        the pair reads as `1, -lower_k upper_k` (a 2 x 2 block pivot), so that a
        regular matrix with a zero leading minor (e.g. a zero main diagonal) has
        its determinant, and a singular one its zero."""
        couple = self.lower_diag * self.upper_diag
        zero = u[..., :-1] == 0
        # One entry each (also for n = 1, where `zero` is empty).
        edge = jnp.zeros((*u.shape[:-1], 1), bool)
        after = jnp.concatenate([edge, zero], axis=-1)
        before = jnp.concatenate([zero, edge], axis=-1)
        shifted = jnp.concatenate([jnp.zeros_like(u[..., :1]), -couple], axis=-1)
        pivots = jnp.where(after, shifted, jnp.where(before, 1, u))
        return jnp.where(jnp.isfinite(pivots), pivots, 1).astype(u.dtype)

    def pivoted_solve(self, b: Array, *, transpose: bool) -> Array:
        """Solve `T x = b` (`Tᵀ x = b` if `transpose`) for `b` of shape
        `(*batch, n, k)`: what `jnp.linalg.solve` computes (see `HalfSolved`).
        On the CPU with partial pivoting (`lax.linalg.tridiagonal_solve`,
        LAPACK's `gtsv`), O(n k), accurate at a tiny leading pivot of a
        well-conditioned matrix, where the Thomas factors of `lu` are not; on
        GPU and TPU by parallel cyclic reduction, O(n k log n) work in
        `⌈log₂ n⌉` steps, checked by its backward error, with
        `lax.linalg.tridiagonal_solve` where the check fails (see
        `quax_structured.tridiagonal_solver`)."""
        lower, main, upper = self._diags()
        if transpose:
            lower, upper = upper, lower
        dtype = jnp.result_type(main, b)
        batch = jnp.broadcast_shapes(main.shape[:-1], b.shape[:-2])
        zero = jnp.zeros_like(main[..., :1])
        diags = (
            jnp.concatenate([zero, lower], axis=-1),
            main,
            jnp.concatenate([upper, zero], axis=-1),
        )
        dl, d, du = (
            jnp.broadcast_to(v, (*batch, v.shape[-1])).astype(dtype) for v in diags
        )
        b = jnp.broadcast_to(b, (*batch, *b.shape[-2:])).astype(dtype)
        return tridiagonal_solve(dl, d, du, b)

    def determinant(self) -> Array:
        """`det T` by the continuant recurrence (see `_continuant`): a polynomial
        in the diagonals, whose derivative is exact at singular matrices."""
        det, exponent = _continuant(*self._diags())
        return det * jnp.exp2(exponent.astype(det.real.dtype)).astype(det.dtype)

    def log_determinant(self) -> tuple[Array, Array]:
        """The sign and `log |det T|` from the continuant recurrence: their
        derivative (`d det / det`) needs no pivot, so it is exact at a zero
        leading minor, where the Thomas pivots are not finite."""
        det, exponent = _continuant(*self._diags())
        size = jnp.abs(det)
        if jnp.issubdtype(det.dtype, jnp.complexfloating):
            sign = det / jnp.where(size > 0, size, 1).astype(det.dtype)
        else:
            sign = jnp.sign(det)
        return sign, jnp.log(size) + exponent * jnp.log(2).astype(size.dtype)

    def triangular_solve(
        self, b: Array, *, lower: bool, transpose_a: bool, unit_diagonal: bool
    ) -> Array:
        """Solve `op(A) x = b` with `A` the lower (or upper) triangle of this matrix,
        for `b` of shape `(*batch, n, k)`: a bidiagonal solve, O(n k)."""
        off = self.lower_diag if lower else self.upper_diag
        forward = lower != transpose_a
        diag = None if unit_diagonal else self.main_diag
        return _bidiagonal_solve(diag, off, b, forward)

    def eigh(self) -> "tuple[Array, TridiagonalEigenvectors] | None":
        """For a real matrix (which `jnp.linalg.eigh` has made symmetric): the
        eigenvalues by bisection (`jax.scipy.linalg.eigh_tridiagonal`), O(n²),
        in ascending order; the eigenvectors only as a `TridiagonalEigenvectors`,
        which refuses every use (no structured algorithm computes them), so that
        `jnp.linalg.eigvalsh` runs and `eigh`'s vectors refuse where used."""
        if jnp.issubdtype(self.dtype, jnp.complexfloating) or self.allow_materialise:
            return None

        values = _eigenvalues
        for _ in range(self.main_diag.ndim - 1):
            values = jax.vmap(values)
        return _no_derivative(values)(
            self.main_diag, self.lower_diag
        ), TridiagonalEigenvectors(self)

    def _diags(self) -> tuple[Array, Array, Array]:
        return self.lower_diag, self.main_diag, self.upper_diag


def _eigenvalues(main: Array, off: Array) -> Array:
    """The eigenvalues of the real symmetric tridiagonal matrix with diagonal `main`
    and off-diagonal `off` (one matrix), ascending: bisection on Sturm counts,
    `jax.scipy.linalg.eigh_tridiagonal`, on the matrix scaled by a power of two to a
    largest entry in `[0.5, 1)` (exact) and with a first off-diagonal of magnitude
    at least `_first_off_min` (a change to the eigenvalues of at most that, far
    below the float's resolution at that scale).

    JAX's Sturm count replaces a first pivot `main[0] - x` of zero (at a bisection
    point `x` equal to `main[0]`) by `(eps |off[0]|)²`, which is zero where
    `off[0]` is (or underflows): the next pivot is then `0 / 0`, and the count of
    eigenvalues below `x` is 0. An eigenvalue below `main[0]` was then returned as
    `main[0]`, silently (`main = [4, 4, 4, 4]`, `off = [0, 1.5, 0.75]` gave `[4, 4,
    4, 5.68]` where dense JAX gives `[2.32, 4, 4, 5.68]`)."""
    largest = jnp.maximum(
        jnp.max(jnp.abs(main), initial=0), jnp.max(jnp.abs(off), initial=0)
    )
    _, exponent = jnp.frexp(jnp.where(largest > 0, largest, 1))
    scale = jnp.exp2(-exponent.astype(main.dtype))
    main, off = main * scale, off * scale
    first = jnp.maximum(jnp.abs(off[:1]), _first_off_min(main.dtype))
    off = jnp.concatenate([first.astype(off.dtype), off[1:]])
    values = jax.scipy.linalg.eigh_tridiagonal(main, off, eigvals_only=True)
    return values / scale


def _first_off_min(dtype: Any) -> Any:
    """The least first off-diagonal magnitude whose pivot perturbation in JAX's
    Sturm count, `(eps |off[0]|)²`, is a normal number (16 times the smallest)."""
    info = jnp.finfo(dtype)
    return 4 * float(info.smallest_normal) ** 0.5 / float(info.eps)


def _continuant(lower: Array, main: Array, upper: Array) -> tuple[Array, Array]:
    """`det T = θ 2^e` by the continuant recurrence `θ_i = main_i θ_{i-1} -
    lower_{i-1} upper_{i-1} θ_{i-2}` over the last axis, O(n), with no division:
    `(θ, e)`. Each step scales the pair of minors by a power of two (exact; a
    constant to derivatives), so that none overflows or underflows."""

    def step(carry, x):
        before, previous, exponent = carry
        m, couple = x
        current = m * previous - couple * before
        size = lax.stop_gradient(jnp.maximum(jnp.abs(previous), jnp.abs(current)))
        _, e = jnp.frexp(jnp.where(size > 0, size, 1))
        e = jnp.clip(e, -100, 100)
        scale = jnp.exp2(-e.astype(size.dtype)).astype(current.dtype)
        return (previous * scale, current * scale, exponent + e), None

    m = jnp.moveaxis(main, -1, 0)
    couple = jnp.moveaxis(lower * upper, -1, 0)
    start = (jnp.ones_like(m[0]), m[0], jnp.zeros(m.shape[1:], jnp.int32))
    (_, det, exponent), _ = lax.scan(step, start, (m[1:], couple))
    return det, exponent


def _bidiagonal_solve(diag: Array | None, off: Array, b: Array, forward: bool) -> Array:
    """Solve a bidiagonal system: `x[i] = (b[i] - off[j] x[i -+ 1]) / diag[i]` with
    `j = i - 1` forwards, `j = i` backwards. `diag=None` is a unit diagonal."""
    bt = jnp.moveaxis(b, -2, 0)
    offt = jnp.moveaxis(off, -1, 0)[..., None]
    diagt = None if diag is None else jnp.moveaxis(diag, -1, 0)[..., None]
    if not forward:
        bt, offt = bt[::-1], offt[::-1]
        diagt = None if diagt is None else diagt[::-1]

    def step(x_prev, xs):
        if diagt is None:
            bi, oi = xs
            x = bi - oi * x_prev
        else:
            bi, oi, di = xs
            x = (bi - oi * x_prev) / di
        return x, x

    first = bt[0] if diagt is None else bt[0] / diagt[0]
    xs = (bt[1:], offt) if diagt is None else (bt[1:], offt, diagt[1:])
    _, rest = lax.scan(step, first, xs)
    out = jnp.concatenate([first[None], rest])
    if not forward:
        out = out[::-1]
    return jnp.moveaxis(out, 0, -2)


def _no_derivative(fn):
    """`fn` with a derivative that refuses at trace time, naming the way out."""
    wrapped = jax.custom_jvp(fn)

    @wrapped.defjvp
    def _(primals, tangents):
        raise StructuredMaterialisationError(
            "Refusing to differentiate the eigenvalues of a `TridiagonalMatrix` "
            "(primitive `eigh`): their derivative needs the eigenvectors, which "
            "quax-structured does not compute. Pass `allow_materialise=True` to "
            "`TridiagonalMatrix` or call `.enable_materialise()` to differentiate "
            "the dense eigendecomposition."
        )

    return wrapped


class TridiagonalEigenvectors(StructuredMatrix):
    """The eigenvectors `jnp.linalg.eigh` returns for a `TridiagonalMatrix`: not
    computed (no structured algorithm), refused wherever they are used, so that
    `jnp.linalg.eigvalsh` (which drops them) runs.

    **Fields:**

    - `matrix`: the `TridiagonalMatrix`.
    """

    conjugates_leafwise = False

    matrix: TridiagonalMatrix

    def __check_init__(self):
        if not isinstance(self.matrix, TridiagonalMatrix):
            raise ValueError(
                "`TridiagonalEigenvectors` stands for the eigenvectors of a "
                "`TridiagonalMatrix`: its `matrix` must be one; got a "
                f"`{type(self.matrix).__name__}`."
            )

    def aval(self) -> jax.core.ShapedArray:
        return self.matrix.aval()

    def way_out(self, primitive: Any) -> str:
        del primitive
        return (
            "The eigenvectors of a `TridiagonalMatrix` have no structured "
            "algorithm: use `jnp.linalg.eigvalsh` for the eigenvalues alone, or "
            "pass `allow_materialise=True` to the `TridiagonalMatrix` (or call "
            "`.enable_materialise()`) for the dense eigendecomposition."
        )

    def dense(self) -> Array:
        raise StructuredMaterialisationError(
            "Refusing to materialise `TridiagonalEigenvectors` (the output of "
            f"primitive `eigh`). {self.way_out(None)}"
        )
