"""Quax: multiple dispatch over custom array-ish objects in JAX."""

from . import (
    _higher_order as _higher_order,  # registers the higher-order rules
    examples as examples,
    hookspecs as hookspecs,
    plugins as plugins,
    zero as zero,
)
from ._higher_order import JoinError as JoinError
from ._quaxify import quaxify as quaxify
from ._registry import (
    Resolution as Resolution,
    RuleConflictWarning as RuleConflictWarning,
    fallback_rule as fallback_rule,
    register as register,
    register_elementwise as register_elementwise,
    resolve as resolve,
)
from ._trace import set_debug_checks as set_debug_checks
from ._values import (
    ArrayValue as ArrayValue,
    MaterialisationReport as MaterialisationReport,
    Value as Value,
    is_value as is_value,
    track_materialisation as track_materialisation,
)
from ._version import __version__ as __version__


def __getattr__(name: str) -> object:
    # `quax.lora` (and any other family) as in the published quax: resolved lazily.
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return getattr(examples, name)
    except ImportError as e:
        raise AttributeError(f"module 'quax' has no attribute {name!r} ({e})") from e
