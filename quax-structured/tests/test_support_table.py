"""The README's table of decompositions and matrix functions (issue 29, item 6)
is the one the rules generate (`quax_structured._table`), every cell that is
not refused runs and matches the dense computation (NumPy/SciPy on the dense
matrix, built here from the same leaves without the package), and every refused
cell names the way out."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import scipy.linalg
from quax_structured import StructuredMaterialisationError, StructuredMatrix
from quax_structured._table import (
    BEGIN,
    END,
    NA,
    NB,
    OPERATIONS,
    STRUCTURES,
    cell,
    leaves,
    support_table,
)


README = Path(__file__).parents[1] / "README.md"


def _sym(x):
    return (x + x.T) / 2


def _banded(x):
    bands, out = x["bands"], np.zeros((6, 6), x["bands"].dtype)
    for k, d in enumerate(range(-1, 3)):  # lower bandwidth 1, upper 2
        for i in range(6):
            if 0 <= i + d < 6:
                out[i, i + d] = bands[k, i]
    return out


# The dense matrix of each example, from its leaves, without the package.
DENSE = {
    "Tridiagonal": lambda x: (
        np.diag(x["main"]) + np.diag(x["lower"], -1) + np.diag(x["upper"], 1)
    ),
    "Diagonal": lambda x: np.diag(x["d"]),
    "ScaledIdentity": lambda x: x["scale"] * np.eye(6, dtype=x["scale"].dtype),
    "Triangular": lambda x: np.tril(x["array"]),
    "LowRank": lambda x: x["u"] @ x["v"].T,
    "LowRankPlusDiagonal": lambda x: np.diag(x["d"]) + x["u"] @ x["v"].T,
    "Kronecker": lambda x: np.kron(x["a"], x["b"]),
    "Kronecker, `symmetric=True`": lambda x: np.kron(_sym(x["a"]), _sym(x["b"])),
    "Kronecker sum `A ⊗ I + I ⊗ B`": lambda x: (
        np.kron(x["a"], np.eye(NB)) + np.kron(np.eye(NA), x["b"])
    ),
    "KroneckerPlusIdentity": lambda x: (
        np.kron(_sym(x["a"]), _sym(x["b"])) + x["scale"] * np.eye(6)
    ),
    "Banded": _banded,
    "BlockDiagonal": lambda x: scipy.linalg.block_diag(*x["blocks"]),
    "Circulant": lambda x: scipy.linalg.circulant(x["column"]),
    "Toeplitz": lambda x: scipy.linalg.toeplitz(x["column"], x["row"]),
}


def test_readme_holds_the_generated_table():
    text = README.read_text()
    assert BEGIN in text and END in text, "README: the generated table's markers"
    inside = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert inside == support_table(), (
        "The README's support table is not the generated one: run "
        "`python scripts/structured_table.py` to rewrite it."
    )


def test_every_structure_has_a_dense_reference():
    assert set(DENSE) == set(STRUCTURES)


def _dense(o, n):
    """A structured output as a dense array, through its product with `I`."""
    if isinstance(o, StructuredMatrix):
        return np.asarray(quax.quaxify(lambda m: m @ jnp.eye(n, dtype=m.dtype))(o))
    return np.asarray(o)


def _unitary(q, tol):
    n = q.shape[-1]
    np.testing.assert_allclose(q.conj().T @ q, np.eye(n), atol=tol)


def _check(operation, out, a, tol):
    """`out` (the structured run's outputs, dense) against NumPy/SciPy on `a`
    (complex128 or float64): reconstructions where the factors are not unique
    (signs, phases, the order of equal values), the values themselves where
    they are."""
    n = a.shape[-1]
    close = lambda got, want: np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    if operation == "`jnp.linalg.svd`":
        u, s, vh = out
        close(s, np.linalg.svd(a, compute_uv=False))
        assert np.all(np.diff(s) <= 0), "singular values descending"
        close((u * s) @ vh, a)
        _unitary(u, tol)
        _unitary(vh.conj().T, tol)
    elif operation == "`jnp.linalg.svdvals`":
        close(out[0], np.linalg.svd(a, compute_uv=False))
    elif operation == "`jnp.linalg.qr`":
        q, r = out
        close(q @ r, a)
        _unitary(q, tol)
        assert np.all(np.tril(r, -1) == 0), "R upper triangular"
    elif operation in ("`jnp.linalg.eigh`", "`jnp.linalg.eigvalsh`"):
        h = (a + a.conj().T) / 2
        w = out[0]
        close(w, np.linalg.eigvalsh(h))
        assert np.all(np.diff(w) >= 0), "eigenvalues ascending"
        if operation == "`jnp.linalg.eigh`":
            v = out[1]
            close((v * w) @ v.conj().T, h)
            _unitary(v, tol)
    elif operation == "`jnp.linalg.lstsq(M, b)`":
        b = np.linspace(1.0, 2.0, n)
        x, _, rank, s = out
        want_x, _, want_rank, want_s = np.linalg.lstsq(a, b, rcond=None)
        close(x, want_x)
        close(s, want_s)
        assert rank == want_rank
    elif operation == "`jnp.linalg.pinv`":
        close(out[0], np.linalg.pinv(a, rcond=1e-10))
    elif operation == "`jax.scipy.linalg.expm`":
        close(out[0], scipy.linalg.expm(a))
    elif operation == "`jnp.linalg.matrix_power(M, 3)`":
        close(out[0], np.linalg.matrix_power(a, 3))
    else:
        raise AssertionError(f"no check for {operation}")


def _run(operations, matrix):
    """Each of `operations` on `matrix`, in one program under `jax.jit` (the
    example closed over, as a constant of the program): per operation, the names
    of its structured outputs' types and its outputs, the structured ones made
    dense through their product with `I` (an output that refuses every use, such
    as `TridiagonalEigenvectors`, refuses there)."""
    n = matrix.shape[-1]
    kinds = {}

    def dense(o):
        return quax.quaxify(lambda m: m @ jnp.eye(n, dtype=m.dtype))(o)

    def run():
        results = {}
        for operation in operations:
            out = quax.quaxify(OPERATIONS[operation])(matrix)
            outs = out if isinstance(out, tuple) else (out,)
            structured = [o for o in outs if isinstance(o, StructuredMatrix)]
            kinds[operation] = [f"`{type(o).__name__}`" for o in structured]
            results[operation] = [
                dense(o) if isinstance(o, StructuredMatrix) else o for o in outs
            ]
        return results

    results = jax.jit(run)()
    return kinds, jax.tree.map(np.asarray, results)


def _matrix(structure, x):
    return STRUCTURES[structure].build({k: jnp.asarray(v) for k, v in x.items()})


@pytest.mark.parametrize("structure", STRUCTURES)
def test_refused_cells_name_the_way_out(structure):
    matrix = _matrix(structure, leaves(structure, np.float32))
    for operation in OPERATIONS:
        if cell(operation, structure) != "refused":
            continue  # checked by `test_cells_match_dense`
        with pytest.raises(StructuredMaterialisationError) as info:
            _run([operation], matrix)
        message = str(info.value)
        assert "allow_materialise=True" in message, operation
        assert "enable_materialise()" in message, operation


# float32 repeats float64's cells (the same rules, real arithmetic) at single
# precision's tolerance, which complex64 checks too (its `eps` is float32's) with
# conjugation besides, where the structure takes complex entries: sweeps (`bash
# scripts/test.sh sweeps`), but for the structures without a complex example, whose
# float32 cells CI runs.
_CASES = [
    pytest.param(
        s,
        dtype,
        id=f"{s}-{dtype.__name__}",
        marks=[pytest.mark.sweep] if dtype is np.float32 and example.complex else [],
    )
    for s, example in STRUCTURES.items()
    for dtype in (np.float32, np.float64, np.complex64)
    if dtype is not np.complex64 or example.complex
]


@pytest.mark.parametrize("structure, dtype", _CASES)
def test_cells_match_dense(structure, dtype):
    """Every cell of `structure` that is not refused runs and matches the dense
    computation, with the output types the table names."""
    operations = [op for op in OPERATIONS if cell(op, structure) != "refused"]
    x = leaves(structure, dtype)
    with jax.enable_x64(dtype is np.float64):
        kinds, results = _run(operations, _matrix(structure, x))
    a = DENSE[structure]({k: np.asarray(v, np.complex128) for k, v in x.items()})
    if not np.iscomplexobj(np.asarray(dtype(0))):
        a = a.real
    tol = {np.float32: 5e-5, np.complex64: 5e-5, np.float64: 1e-11}[dtype]
    for operation in operations:
        assert (", ".join(kinds[operation]) or "yes") == cell(operation, structure)
        try:
            _check(operation, results[operation], a, tol)
        except AssertionError as e:
            raise AssertionError(f"{operation} on {structure}: {e}") from e
