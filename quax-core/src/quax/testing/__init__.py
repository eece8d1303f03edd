"""`quax.testing`: the conformance kit for quax families, ours or a third party's.

- [`quax.testing.assert_matches_dense`][]: `quax.quaxify(fn)` against `fn` on dense
    arrays (values, output types, `jit`, `vmap`, `grad`, `jvp`), and nothing
    materialised unless allowed.
- [`quax.testing.compiled_hlo`][], [`quax.testing.assert_hlo_lacks`][]: "the compiled
    program holds no array of shape S / no op of kind K".
- [`quax.testing.run_on_simulated_devices`][]: a program on 8 simulated CPU devices.
- [`quax.testing.assert_family_layout`][]: a family's modules in their roles, one-way
    imports, and the core's materialisation policy.
- [`quax.testing.assert_thread_safe`][]: many threads calling a quaxified function,
    eagerly and jitted, while rules are registered, get what one thread gets.
- [`quax.testing.assert_registration_all_or_nothing`][]: a family whose registration
    raises half-way leaves every rule, setting and value type as it was.
- [`quax.testing.cache_eager_primitive_programs`][]: a suite under JAX's tracer-leak
    check keeps each eager primitive's compiled program, as JAX does without it.
- `quax.testing.strategies`: hypothesis strategies (shapes, dtypes, arrays,
    `dot_general` dimension numbers, small programs). It needs `hypothesis` and is
    imported on first use.
"""

import importlib
from typing import Any

from ._compare import Tolerance as Tolerance, tolerance as tolerance
from ._dense import (
    ConformanceReport as ConformanceReport,
    assert_matches_dense as assert_matches_dense,
    densify as densify,
)
from ._devices import run_on_simulated_devices as run_on_simulated_devices
from ._faults import (
    RegistrationFault as RegistrationFault,
    assert_registration_all_or_nothing as assert_registration_all_or_nothing,
    registry_state as registry_state,
)
from ._hlo import (
    HloInstruction as HloInstruction,
    assert_hlo_lacks as assert_hlo_lacks,
    compiled_hlo as compiled_hlo,
    hlo_instructions as hlo_instructions,
    hlo_ops as hlo_ops,
    hlo_shapes as hlo_shapes,
)
from ._layout import (
    assert_family_layout as assert_family_layout,
    family_layout_problems as family_layout_problems,
)
from ._suite import cache_eager_primitive_programs as cache_eager_primitive_programs
from ._threads import assert_thread_safe as assert_thread_safe


def __getattr__(name: str) -> Any:
    # `quax.testing.strategies` imports hypothesis: only when used.
    if name == "strategies":
        return importlib.import_module(f"{__name__}.strategies")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
