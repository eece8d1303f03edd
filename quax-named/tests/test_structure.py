"""The family follows the layout every quax family shares.

Its modules are in their roles (`_value.py` or `_values/`, `_rules.py`,
`_kernels.py`, `_model.py`, `_nnx.py`, `_plugin.py`), every rule is registered in
the rules, imports run one way with no cycle, and the values follow the core's
materialisation policy (`quax.GuardedValue`).
"""

import quax.testing as qt


def test_family_layout():
    qt.assert_family_layout("quax_named")
