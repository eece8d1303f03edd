"""Installed families: loading, blocking and introspection.

See `quax.hookspecs` for what a family implements, and `python -m quax --help` for
the same information on the command line.
"""

from ._caching._keys import add_setting as add_setting
from ._dispatch._plugins import (
    DISABLE_ENV as DISABLE_ENV,
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
    Family as Family,
    PluginWarning as PluginWarning,
    block as block,
    families as families,
    load as load,
    manager as manager,
)
from ._dispatch._registry import (
    resolve as resolve,
    rules_generation as rules_generation,
)
from ._foundation._evaluation import (
    EvaluationReport as EvaluationReport,
    track_evaluations as track_evaluations,
)
from ._foundation._jit_context import (
    JitContext as JitContext,
    jit_context as jit_context,
)
from ._introspect import (
    FamilySummary as FamilySummary,
    materialisations as materialisations,
    primitive_named as primitive_named,
    summarise as summarise,
)
