"""The dispatch layer: rules and how they are found. The registry (`quax.register`,
resolution through plum, the dispatch cache and the registry's generation,
`_registry`), values built inside a program JAX stages (`_staged`), what a rule can
know of a plain operand at trace time (`quax.known_constant` and its kin, `_known`),
and the plugin loader that discovers and loads the installed families (`_plugins`)."""
