"""Hook specifications for quax families (plugins), in the style of pytest's.

A family is a distribution that declares an entry point in the group `quax.rules`:

```toml
[project.entry-points."quax.rules"]
lora = "quax_lora._plugin"
```

The entry point's name is the family's name; its object (usually a module) implements
some of the hooks below, each marked with `@quax.hookspecs.hookimpl`. Quax loads the
families lazily (the first quaxified call, the first `quax.examples` access, or
`quax.plugins.load()`), calling `quax_register_rules` once per family. The symbolic
zeros are a family built into quax-core (`quax.zero._plugin` implements these hooks),
loaded at `import quax`.
"""

from collections.abc import Sequence
from types import ModuleType

import pluggy

from ._values._value import Value


__all__ = ["hookimpl", "hookspec", "PROJECT"]

PROJECT = "quax"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def quax_register_rules() -> None:
    """Register the family's rules with `quax.register`.

    Called once, when the family is loaded. Importing the module that holds the
    `@quax.register` decorators is enough. Rules must not be registered at the import
    of the entry-point module itself, so that a broken family is isolated.

    **Returns:**

    Nothing.
    """


@hookspec
def quax_value_types() -> Sequence[type[Value]]:
    """The `quax.Value` subclasses the family defines, for introspection.

    **Returns:**

    A sequence of classes.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def quax_example_module() -> ModuleType:
    """The module that `quax.examples.<name>` resolves to. Without this hook it is
    the top-level package of the entry point's module.

    **Returns:**

    A module.
    """
    raise NotImplementedError


@hookspec
def quax_example_aliases() -> Sequence[str]:
    """Other names under which `quax.examples` finds this family (for example
    `structured_matrices` for `structured`).

    **Returns:**

    A sequence of names.
    """
    raise NotImplementedError
