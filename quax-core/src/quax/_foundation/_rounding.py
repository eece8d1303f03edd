"""An evaluator that rounds a compiled program as its equations round one by one.

Quax compiles an eager library call on values into one program (see
`quax._caching._eager`); run equation by equation, each equation is a program of its
own, which XLA cannot fuse with the next. `eval_rounding_each_step` stages the
equations with optimisation barriers between them, so that the compiled program gives
the same bits.
"""

from typing import Any

from jax import lax

from .._compat import Literal, ShapedArray, eqn_context, typeof, user_context


__all__ = ["KEEP_BARRIERS", "eval_rounding_each_step"]


# XLA removes optimisation barriers (its `cse_barrier_expander` pass) before it fuses
# and contracts; compiled without that pass, a barrier stands between the operations
# on either side of it, so none is fused into another across it.
KEEP_BARRIERS = {"xla_disable_hlo_passes": "cse_barrier_expander"}


def eval_rounding_each_step(jaxpr: Any, consts: Any, *args: Any) -> list[Any]:
    """Evaluate the top-level equations of `jaxpr` one by one, as
    `jax.core.eval_jaxpr` does, with an optimisation barrier after each
    equation's outputs and after each literal and constant.

    Staged in a `jax.jit` compiled with `KEEP_BARRIERS`, the program then rounds
    each equation's outputs as running the equations one by one does (each a
    program of its own): XLA fuses no two equations, so it cannot contract a
    multiply and an add into one fused multiply-add, nor fold an operation on a
    constant with its own arithmetic. An equation that is itself a program (a
    nested `jit`) compiles whole inside, as it does when run on its own.
    """
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        if isinstance(v, Literal):
            return _barrier(v.val)
        return env[v]

    for var, const in zip(jaxpr.constvars, consts, strict=True):
        env[var] = _barrier(const)
    for var, arg in zip(jaxpr.invars, args, strict=True):
        env[var] = arg
    for eqn in jaxpr.eqns:
        params = eqn.primitive.get_bind_params(eqn.params)
        with eqn_context(eqn.ctx), user_context(eqn.source_info.traceback):
            outs = eqn.primitive.bind(*map(read, eqn.invars), **params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        for var, out in zip(eqn.outvars, outs, strict=True):
            env[var] = _barrier(out)
    return [read(v) for v in jaxpr.outvars]


def _barrier(x: Any) -> Any:
    """`x` behind an optimisation barrier, where it is an array (a token or other
    non-array value passes as it is)."""
    if isinstance(typeof(x), ShapedArray):
        return lax.optimization_barrier(x)
    return x
