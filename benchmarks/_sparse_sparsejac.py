"""The sparse Jacobian of `benchmarks/sparse_jacobian.py` computed by `sparsejac`
(the small JAX library that colours a sparsity pattern with networkx), against
dense `jax.jacfwd` timed in the same process, in sparsejac's own environment.

sparsejac is not a dependency of quax, so it runs in an environment of its own,
outside the repository:

    python -m venv sparsejac-env
    sparsejac-env/bin/pip install sparsejac==0.2.0 scipy

`python benchmarks/sparse_jacobian.py --sparsejac-python sparsejac-env/bin/python`
(or `QUAX_SPARSEJAC_PYTHON=sparsejac-env/bin/python python benchmarks/run.py --only
sparse_jacobian`) runs this script with that interpreter, in the same run as its own
measurements, and reads the JSON it prints.

The residual is `residual_fn` of `examples/sparse_newton.py`, read from that file
(which imports quax, not installed here) rather than copied; the pattern is the
same 5-point stencil, built with scipy.
"""

import argparse
import ast
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse  # noqa: E402
import sparsejac  # noqa: E402  # pyright: ignore[reportMissingImports]  (sparsejac-env, above)
from jax.experimental import sparse as jsparse  # noqa: E402


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sparse_newton.py"
DENSE_MAX_BYTES = 2**28  # as in `sparse_jacobian.py`


def _residual_fn() -> Callable[[int], Callable]:
    """`residual_fn` from the example, without running its imports."""
    tree = ast.parse(EXAMPLE.read_text())
    wanted: list[ast.stmt] = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "residual_fn"
    ]
    namespace: dict[str, Any] = {"jnp": jnp}
    exec(compile(ast.Module(wanted, []), str(EXAMPLE), "exec"), namespace)
    return namespace["residual_fn"]


def _stencil(m: int) -> jsparse.BCOO:
    """The 5-point stencil's pattern on an `m x m` grid, as the example builds it."""
    eye = scipy.sparse.eye_array(m)
    line = scipy.sparse.eye_array(m, k=-1) + eye + scipy.sparse.eye_array(m, k=1)
    grid = (scipy.sparse.kron(line, eye) + scipy.sparse.kron(eye, line)).tocoo()
    return jsparse.BCOO.from_scipy_sparse(grid)


def _timed(fn: Callable, x: Any, rounds: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn(x)`, each timed call right after an
    untimed one."""
    jax.block_until_ready(fn(x))
    walls, cpus = [], []
    for _ in range(rounds):
        jax.block_until_ready(fn(x))
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(x))
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus)


def main(sides: list[int], rounds: int) -> dict[str, Any]:
    residual_fn = _residual_fn()
    rows = []
    for m in sides:
        n = m * m
        f = residual_fn(m)
        pattern = _stencil(m)
        start = time.process_time()
        jac = sparsejac.jacfwd(f, pattern)  # colours with networkx here
        setup_cpu = time.process_time() - start
        u = jnp.asarray(np.random.default_rng(0).normal(size=n))
        compiled = jax.jit(jac)
        # The number of colours (JVPs), from sparsejac's own colouring helper.
        connectivity = sparsejac.sparsejac._input_connectivity_from_sparsity(
            scipy.sparse.coo_matrix(
                (np.asarray(pattern.data), np.asarray(pattern.indices).T),
                shape=pattern.shape,
            )
        )
        _, colours = sparsejac.sparsejac._greedy_color(connectivity, "largest_first")
        row: dict[str, Any] = {"n": n, "setup_cpu": setup_cpu, "colours": colours}
        row["sparsejac"] = _timed(compiled, u, rounds)
        got = compiled(u)
        if n * n * 8 <= DENSE_MAX_BYTES:
            dense = jax.jit(jax.jacfwd(f))
            row["dense"] = _timed(dense, u, rounds)
            assert np.allclose(np.asarray(got.todense()), np.asarray(dense(u)))
        rows.append(row)
    versions = {
        name: importlib.metadata.version(name)
        for name in ("jax", "sparsejac", "networkx")
    }
    return {"rows": rows, "versions": versions}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sides", default="32,64,128")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sides = [int(s) for s in args.sides.split(",")]
    print(json.dumps(main(sides, args.rounds)))
