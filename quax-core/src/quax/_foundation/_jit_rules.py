"""JAX's rules for `jit_p`, as quax replaces them for `quax.register_function`.

- Staging: JAX inlines a `jax.jit(inline=True)` function (every `jax.numpy`
  function) into the jaxpr that calls it, so a rule registered for `jnp.rad2deg`
  would never meet its `jit` in a body JAX traced itself. `keep_inline_jit` keeps such
  a registered function's `jit` as a call (`_keep_or_inline` wraps JAX's staging
  rule, which still inlines every other inline `jit`).
- Derivatives: `differentiate_jits_with` wraps JAX's `jvp` and `linearize` rules of
  `jit`, so that a registered function with a `jvp` is differentiated by it rather
  than through its body.

Both are installed on the first registration that needs them, never at
`import quax`, and leave a plain JAX program's results unchanged. The private API
they replace is reached through `quax._compat`.
"""

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._compat import (
    AdZero,
    holds_refs,
    inline_jaxpr_into_trace,
    instantiate_zeros,
    jax_jit_staging_rule,
    jit_derivative_rules,
    jit_inlines,
    jit_p,
    set_jit_derivative_rules,
    set_jit_staging_rule,
)


__all__ = ["differentiate_jits_with", "keep_inline_jit", "kept_inline_jits"]


# The functions that `quax.register_function` has rules for and whose `jit` JAX
# inlines (`jnp.rad2deg` is `jax.jit(inline=True)`): their sources (a body's
# `func_src_info`, "rad2deg at .../ufuncs.py:3278") by the name their `jit` equations
# carry. Filled by `keep_inline_jit`; read by JAX's staging of `jit` (see
# `_keep_or_inline`) and by the quax trace (an inlined `jit` of such a source goes to
# the `jit` rule, which looks its rules up, instead of its equations being bound one
# by one). Every other inlined `jit` costs one lookup of its name.
kept_inline_jits: dict[str, set[str]] = {}


def keep_inline_jit(name: str, source: str) -> None:
    """Keep every inline `jit` named `name` whose body's source is `source` as a
    `jit` equation (a call) wherever JAX stages it, from now on, rather than have JAX
    inline its equations into the caller's jaxpr (its own staging rule for `jit`
    does so for `jax.jit(inline=True)`, as every `jax.numpy` function is). A rule
    registered for the function can then run wherever quax meets the program: in a
    `jax.jit`-decorated function, a `lax.scan`, `lax.cond` or `lax.while_loop` body, a
    `jax.checkpoint` or `custom_jvp` function, all of which JAX traces before quax
    meets them. A kept call computes what its inlined equations compute (lowering
    honours no `inline`), so plain JAX programs give the same results.

    JAX keeps the jaxprs it traced (of `jax.jit` functions, of loop bodies), and one
    traced before the function was kept holds its inlined equations; none reaches
    quax. One traced inside `quaxify` is keyed apart from one traced outside
    (`staged_values_state` is part of JAX's trace context), and registering a rule
    changes another part of it (`quax._dispatch._registry`'s generation), so a `jit`
    traced inside `quaxify` before is traced again. The one registration that keeps
    that generation, the installed families loading on the first quaxified call,
    comes before anything was traced inside `quaxify`."""
    kept_inline_jits.setdefault(name, set()).add(source)
    set_jit_staging_rule(_keep_or_inline)


def _keep_or_inline(trace: Any, source_info: Any, *args: Any, **params: Any) -> Any:
    # JAX's staging rule for `jit` (`pjit_staging_rule`), whose inlining branch it
    # repeats (with `jit_inlines`' cheaper test), but for a kept inline `jit` (see
    # `keep_inline_jit`), which it stages as a call, as JAX stages a `jit` it does not
    # inline. Repeating the branch, rather than calling JAX's rule after the test,
    # keeps tracing a `jax.numpy` program (an inline `jit` per call) as fast as with
    # JAX's own rule.
    if jit_inlines(params) and not params["compiler_options_kvs"]:
        jaxpr = params["jaxpr"]
        sources = kept_inline_jits.get(params["name"])
        if sources is not None and _kept(jaxpr, sources):
            return trace.default_process_primitive(
                jit_p, args, params, source_info=source_info
            )
        out = inline_jaxpr_into_trace(
            trace, source_info, jaxpr.jaxpr, jaxpr.consts, *args
        )
        return [trace.to_jaxpr_tracer(x, source_info) for x in out]
    return jax_jit_staging_rule(trace, source_info, *args, **params)


def _kept(jaxpr: Any, sources: set[str]) -> bool:
    """Whether the body `jaxpr` of an inline `jit` with a kept name is one of the
    kept `sources`. One whose body holds mutable arrays (for which JAX moves
    constant `Ref`s out of a call first) is inlined, as JAX does (the functions
    rules are registered for hold none)."""
    info = jaxpr.jaxpr.debug_info
    return info is not None and info.func_src_info in sources and not holds_refs(jaxpr)


def differentiate_jits_with(tangents_for: Any) -> None:
    """From now on, differentiate a `jit` equation by a tangent map of its own where
    `tangents_for(primals, params)` (given the `jit`'s primal arguments and its
    params) gives one: a function `tangents(primals, tangents)` returning the
    tangents of the outputs (a list), given the primals and their tangents (zeros
    where JAX has none). The outputs themselves are the `jit`'s, bound on the
    primals' trace (where quax runs the rules for them). Under `jax.jvp` the map
    runs there, on the primals and tangents; under `jax.linearize` (as `grad`,
    `vjp`, `jacrev` run it) it runs where JAX stages the tangent computation, with
    the primals as residuals, as JAX stages a `custom_jvp` rule's, and JAX
    transposes what it staged where `grad` needs it. Where `tangents_for` gives
    `None`, JAX's own rules for `jit` run, which differentiate the body: `jax.jvp`
    binds a `jit` of the body's `jvp`, `jax.linearize` a `jit` of the primal part
    and one of the tangent part. Installed once (the first
    `quax.register_function` with a `jvp`); `tangents_for` is asked on every `jvp`
    or `linearize` of a `jit`, so it must be cheap where it answers `None`."""
    jvp_rule, linearize_rule = jit_derivative_rules()

    def tangents_out(
        tangent_map: Any, avals: Sequence[Any], primals: Any, tangents: Any
    ) -> list[Any]:
        # Outputs of integer or boolean types have no tangent (a symbolic zero).
        given = tangent_map(list(primals), list(map(instantiate_zeros, tangents)))
        return [
            t if _has_tangent(a) else AdZero(a.to_tangent_aval())
            for t, a in zip(given, avals, strict=True)
        ]

    def jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> Any:
        tangent_map = tangents_for(primals, params)
        if tangent_map is None:
            return jvp_rule(primals, tangents, **params)
        out = jit_p.bind(*primals, **params)
        avals = params["jaxpr"].out_avals
        return out, tangents_out(tangent_map, avals, primals, tangents)

    def linearize(
        is_vjp: bool, nonzeros: Sequence[bool], *primals: Any, **params: Any
    ) -> Any:
        tangent_map = tangents_for(primals, params)
        if tangent_map is None:
            return linearize_rule(is_vjp, nonzeros, *primals, **params)
        out = jit_p.bind(*primals, **params)
        avals = params["jaxpr"].out_avals

        def linearized(residuals: Sequence[Any], *tangents: Any) -> list[Any]:
            return tangents_out(tangent_map, avals, residuals, tangents)

        return out, list(map(_has_tangent, avals)), list(primals), linearized

    set_jit_derivative_rules(jvp, linearize)


def _has_tangent(aval: Any) -> bool:
    """Whether an output of type `aval` has a tangent: one of an inexact dtype."""
    return bool(jnp.issubdtype(aval.dtype, np.inexact))
