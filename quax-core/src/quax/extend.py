"""For family authors: what a family needs from JAX's internals, behind names that
quax keeps stable across JAX versions (the core reaches them through its one module
of private JAX API, so that a JAX upgrade changes that module, not the families).

A family uses only the public API of `quax`, `quax.plugins`, `quax.testing` and this
module; nothing whose path starts with `quax._`.

- `define_batching_rule(primitive, rule)`: the `jax.vmap` rule of a primitive the
  family defines itself (quax-units' `ustrip`).
- `release_traces(error)`: close the JAX traces an error abandoned, where a family
  catches an error raised while JAX traced a function (and tries another way),
  so that the tracer-leak check does not report them.
- `pinv_function`: the jitted body of `jax.numpy.linalg.pinv` (the public `pinv`
  is a plain function that calls it), for `quax.register_function`.
"""

from ._compat import (
    define_batching_rule as define_batching_rule,
    pinv_function as pinv_function,
    release_traces as release_traces,
)


__all__ = ["define_batching_rule", "pinv_function", "release_traces"]
