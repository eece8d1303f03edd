"""The quax rule for lineax's own `linear_solve` primitive (`lineax.linear_solve`,
which optimistix's root finders and diffrax's implicit solvers call), registered
when lineax is installed.

lineax binds its solve as one primitive, whose implementation runs the solver's
steps (an LU factorisation and triangular solves, a QR, a Cholesky...). The rule
runs those steps under the rules of `_linalg`, which give the solution the units of
the right-hand side divided by those of the operator (a plain operator, such as the
Jacobian of a root find in one unit, is dimensionless).
"""

import functools as ft
from typing import Any

import equinox.internal as eqxi
import jax
import quax
from jaxtyping import ArrayLike

from .._value import Quantity


_Operand = Quantity | ArrayLike

try:
    from lineax._solve import (  # pyright: ignore[reportMissingImports]
        _linear_solve_impl,
        linear_solve_p,
    )
except ImportError:  # lineax is not installed: nothing binds its primitive
    linear_solve_p = None
else:
    # lineax's own implementation of its primitive, as its abstract evaluation runs
    # it: without the check that no traced value is closed over, which guards the
    # primitive's derivative rules. Here the solve runs as its steps, which JAX
    # differentiates as they are.
    _solve_steps = eqxi.filter_primitive_def(
        ft.partial(_linear_solve_impl, check_closure=False)
    )

    @quax.register(linear_solve_p)
    def _linear_solve(
        *dynamic: _Operand, treedef: Any, static: Any, flatten: Any
    ) -> list[Any]:
        # Staged by `jax.jit` first, where lineax's checks of the vector against the
        # operator's structures see shapes and dtypes (as when the primitive was
        # bound), and then run under the rules.
        steps = ft.partial(
            _solve_steps, treedef=treedef, static=static, flatten=flatten
        )
        return quax.quaxify(jax.jit(steps))(*dynamic)
