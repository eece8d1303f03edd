"""The caches layer: what quax keeps between binds and calls. The one key builder of
every cache, value structures included (`_keys`), compiled eager programs (`_eager`),
what is worked out once per jaxpr (`_per_jaxpr`), the recordings replayed while a
program is staged (`_replay`), and the jitted bodies of nested `jit`s (`_nested`).
The tables these are built of, and their switch, are a foundation
(`quax._foundation._caches`)."""
