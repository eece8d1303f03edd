"""The higher-order rules layer: quax's rules for JAX's higher-order primitives and
their helpers. Nested `jit` bodies, `cond`, `remat` and `linear_solve`
(`_control_flow`), the `jit` rule and the rules of jitted library functions
(`_functions`, `quax.register_function`), loops (`_loops`), inner jaxprs as quaxified
functions (`_bodies`), type joins of carries and branches (`_joins`), custom
derivatives and `shard_map` (`_custom`), the nesting of the traces of their
sub-functions that JAX traces while they bind (`_nesting`), host callbacks
(`_callbacks`) and `jax.eval_shape` (`_shapes`). (Rules for first-order primitives on
every value are in `_first_order`.) The symbolic zeros, `quax.zero`, are of this layer
too."""
