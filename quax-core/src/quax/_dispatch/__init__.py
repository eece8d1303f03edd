"""The dispatch layer: rules and how they are found. The registry (`quax.register`,
resolution through plum, the dispatch cache and the registry's generation,
`_registry`), values built inside a program JAX stages (`_staged`), and the plugin
loader that discovers and loads the installed families (`_plugins`)."""
