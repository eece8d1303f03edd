"""The values layer: the values quax dispatches on (`quax.Value`, `quax.ArrayValue`
and materialisation, `_value`), their declared avals (`_avals`), fast construction of
value classes (`_constructors`), the materialisation policy the families share
(`_policy`) and Python's operator methods for value types (`_operators`). The hooks
a family implements, `quax.hookspecs`, are of this layer too."""
