"""Quax: multiple dispatch over custom array-ish objects in JAX."""

from . import (
    examples as examples,
    hookspecs as hookspecs,
    plugins as plugins,
    zero as zero,
)
from ._caching._eager import set_eager_compilation as set_eager_compilation
from ._dispatch import _plugins as _plugins
from ._dispatch._known import (
    known_constant as known_constant,
    known_scale_invariant as known_scale_invariant,
    known_scaled_constant as known_scaled_constant,
)
from ._dispatch._registry import (
    Resolution as Resolution,
    RuleConflictWarning as RuleConflictWarning,
    fallback_rule as fallback_rule,
    register as register,
    register_elementwise as register_elementwise,
    resolve as resolve,
)
from ._first_order import (
    _decompositions as _decompositions,
    _leafwise as _leafwise,
)
from ._foundation import (
    _shadow as _shadow,
    # JAX's lowering: host callbacks on a TPU lowered afresh at every place.
    _tpu_callbacks as _tpu_callbacks,
)
from ._foundation._caches import (
    CacheMismatchError as CacheMismatchError,
    caching as caching,
)
from ._foundation._debug import set_debug_checks as set_debug_checks
from ._foundation._shadow import QuaxShadowWarning as QuaxShadowWarning
from ._foundation._version import __version__ as __version__
from ._foundation._zero_preserving import ZERO_PRESERVING as ZERO_PRESERVING
from ._rules import (
    # The modules that register the core's rules for higher-order primitives.
    _callbacks as _callbacks,
    _control_flow as _control_flow,
    _custom as _custom,
    _functions as _functions,
    _shapes as _shapes,
)
from ._rules._functions import register_function as register_function
from ._rules._joins import JoinError as JoinError
from ._select import (
    map_selected as map_selected,
    nnx_selected as nnx_selected,
)
from ._transform._quaxify import quaxify as quaxify
from ._values._operators import (
    BitwiseOperatorMethods as BitwiseOperatorMethods,
    OperatorMethods as OperatorMethods,
)
from ._values._policy import (
    GuardedValue as GuardedValue,
    MaterialisationError as MaterialisationError,
)
from ._values._value import (
    ArrayValue as ArrayValue,
    MaterialisationReport as MaterialisationReport,
    Value as Value,
    is_value as is_value,
    track_materialisation as track_materialisation,
)


_plugins.load_builtins()
_shadow.warn_if_shadowed()


def __getattr__(name: str) -> object:
    # `quax.lora` (any installed family, by its entry point's name) as in the
    # published quax, resolved lazily. Any other name is unknown at once: the names
    # come from the entry points' metadata, without importing a family.
    if name in _plugins.family_names():
        try:
            return getattr(examples, name)
        except ImportError as e:
            raise AttributeError(
                f"module 'quax' has no attribute {name!r} ({e})"
            ) from e
    raise AttributeError(f"module 'quax' has no attribute {name!r}")
