"""The higher-order rules layer: quax's rules for JAX's higher-order primitives and for
primitives that act on every value alike. Nested `jit`, `cond`, `remat` and
`linear_solve` (`_control_flow`), loops (`_loops`), inner jaxprs as quaxified functions
(`_bodies`), type joins of carries and branches (`_joins`), custom derivatives and
`shard_map` (`_custom`), host callbacks (`_callbacks`), leaf-wise primitives
(`_leafwise`), JAX's newer decompositions (`_decompositions`) and `jax.eval_shape`
(`_shapes`). The symbolic zeros, `quax.zero`, are of this layer too."""
