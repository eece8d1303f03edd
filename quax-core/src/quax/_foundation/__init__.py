"""The foundation layer: what every other layer may use. The cache tables, their
switch (`quax.caching`), their one invalidation path and verify mode (`_caches`); the
registration journal that takes back what a family added (`_journal`); which
distribution registered a rule (`_owners`); the tables of element-wise primitives that
map zero to zero (`_zero_preserving`); the families' `jax.jit`-cache-sensitive
settings, all in one JAX context (`_jit_context`); the evaluator that rounds a
compiled program as its equations do one by one (`_rounding`); what evaluating a
jaxpr reads of an equation, and the count of evaluations (`_evaluation`); quax's
replacements of JAX's rules for `jit_p` (`_jit_rules`); the check for the published
quax installed beside quax-core (`_shadow`); the debug-checks flag that the
transform, declared avals and cache keys read (`_debug`); and `quax.__version__`
(`_version`).
JAX's private API, also at the bottom, stays at `quax._compat`, the path the
published quax's clients import it from."""
