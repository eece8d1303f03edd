"""The caches layer: what quax keeps between binds and calls. The one key builder of
every cache (`_keys`), compiled eager programs and the value-structure keys the other
caches share (`_eager`), what is worked out once per jaxpr (`_per_jaxpr`), and the
recordings replayed while a program is staged (`_replay`). The tables these
are built of, and their switch, are a foundation (`quax._foundation._caches`)."""
