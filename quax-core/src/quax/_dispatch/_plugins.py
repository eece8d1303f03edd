"""The plugin loader: discovers the families declared in the `quax.rules`
entry-point group and manages them with pluggy.

Families load lazily, once: on the first quaxified call, the first
`quax.examples.<name>` import, or an explicit `quax.plugins.load()`. Setting
`QUAX_DISABLE_PLUGIN_AUTOLOAD=1` turns the automatic loading off; `load(name)` still
loads a named family. A family that fails is reported once, as a warning naming its
distribution and the error, and the others keep working.

A family's registration is all or nothing: when it raises half-way, every rule,
setting and value type it added is taken back (see `quax._foundation._journal`), and the
modules of its package that the load imported are forgotten. A load interrupted by a
`KeyboardInterrupt` (or another exception that is not an `Exception`) is taken back the
same way and raised; the family stays available, and the next call loads it.

The families that ship inside quax-core (`BUILTIN_FAMILIES`: the symbolic zeros) go
through the same hooks, but load at `import quax`, whatever the environment says,
as pytest's built-in plugins do.

A family whose load grows JAX's trace context (a `jax.make_user_context` made
as it loads: see `quax._foundation._jit_context`) is reported with a
`PluginWarning` that names it and `jit_context`.
"""

import dataclasses
import importlib
import importlib.metadata
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import pluggy

from .. import hookspecs
from .._compat import trace_context_size
from .._foundation import _journal
from . import _registry


__all__ = [
    "BUILTIN_FAMILIES",
    "ENTRY_POINT_GROUP",
    "Family",
    "PluginWarning",
    "autoload",
    "block",
    "example_module",
    "families",
    "family_names",
    "load",
    "load_builtins",
    "load_in_process",
    "manager",
]

ENTRY_POINT_GROUP = "quax.rules"
DISABLE_ENV = "QUAX_DISABLE_PLUGIN_AUTOLOAD"

# The families that ship inside quax-core: name -> the module implementing the hooks.
BUILTIN_FAMILIES = {"zero": "quax.zero._plugin"}

# The distributions of the families this project publishes (by name and by the
# aliases their hooks declare), for the error raised when `quax.examples.<name>`
# names one that is not installed.
KNOWN_DISTRIBUTIONS = {
    "lora": "quax-lora",
    "sparse": "quax-sparse",
    "units": "quax-units",
    "unitful": "quax-units",
    "quant": "quax-quant",
    "quantised": "quax-quant",
    "quantized": "quax-quant",
    "structured": "quax-structured",
    "structured_matrices": "quax-structured",
    "named": "quax-named",
}


class PluginWarning(UserWarning):
    """A quax family failed to load."""


@dataclasses.dataclass
class Family:
    """An installed quax family, as the loader sees it.

    **Fields:**

    - `name`: the entry point's name (`lora`, `units`, ...).
    - `distribution`, `version`: the distribution that declares it.
    - `entry_point`: the entry point's value (`quax_lora._plugin`).
    - `package`: the package holding the family's code (`quax_lora`).
    - `state`: `"available"` (not loaded yet), `"loaded"`, `"failed"` or `"blocked"`.
    - `error`: why it failed, if it did.
    - `plugin`: the loaded entry-point object.
    - `builtin`: whether it ships inside quax-core.
    """

    name: str
    distribution: str
    version: str
    entry_point: importlib.metadata.EntryPoint
    package: str
    state: str = "available"
    error: str | None = None
    plugin: Any = None
    builtin: bool = False

    def owns(self, module: str) -> bool:
        """Whether the module named `module` is part of this family's code."""
        return module == self.package or module.startswith(self.package + ".")


_manager = pluggy.PluginManager(hookspecs.PROJECT)
_manager.add_hookspecs(hookspecs)
_families: dict[str, Family] | None = None
_blocked: set[str] = set()
_autoloaded = False
# Held while families load: a thread that asks for them meanwhile waits for them; a
# family whose import asks again (in the same thread) goes on without waiting.
_loading = threading.RLock()
_autoloading = False


def manager() -> pluggy.PluginManager:
    """The pluggy plugin manager holding every loaded family."""
    return _manager


def _discover() -> dict[str, Family]:
    global _families
    if _families is None:
        found: dict[str, Family] = {}
        for name, module in BUILTIN_FAMILIES.items():
            ep = importlib.metadata.EntryPoint(name, module, ENTRY_POINT_GROUP)
            found[name] = Family(
                name,
                "quax-core",
                importlib.metadata.version("quax-core"),
                ep,
                module.rpartition(".")[0],
                builtin=True,
            )
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist
            found.setdefault(
                ep.name,
                Family(
                    ep.name,
                    dist.name if dist is not None else "?",
                    dist.version if dist is not None else "?",
                    ep,
                    ep.module.split(".")[0],
                    state="blocked" if ep.name in _blocked else "available",
                ),
            )
        for family in found.values():
            # Discovered again (after `_reset_for_tests`): a family loaded before
            # stays loaded.
            plugin = _manager.get_plugin(family.name)
            if plugin is not None:
                family.state, family.plugin = "loaded", plugin
        _families = found
    return _families


def families() -> list[Family]:
    """Every installed family, whether loaded or not (this loads none).

    **Returns:**

    A list of [`quax.plugins.Family`][].
    """
    return list(_discover().values())


def family_names() -> list[str]:
    """The names of every installed family, read from the entry points' metadata
    (this imports no family).

    **Returns:**

    A list of names.
    """
    return list(_discover())


def load_builtins() -> None:
    """Load the families that ship inside quax-core (`import quax` calls it).

    **Returns:**

    Nothing.
    """
    for family in _discover().values():
        if family.builtin and family.state == "available":
            _load_one(family)


def autoload() -> None:
    """Load every installed family, the first time it is called, unless
    `QUAX_DISABLE_PLUGIN_AUTOLOAD` is set. Cheap afterwards: quaxify calls it.

    Loading counts as done once every family has loaded or failed: after a
    `KeyboardInterrupt` the next call loads the families not loaded yet."""
    global _autoloaded, _autoloading
    if _autoloaded:
        return
    with _loading:
        if _autoloaded or _autoloading:
            return
        _autoloading = True
        try:
            if os.environ.get(DISABLE_ENV, "") in ("", "0"):
                # Before any rule is dispatched: no `jax.jit` needs tracing again
                # for the rules the families add.
                with _registry.jit_generation_kept():
                    load()
            _autoloaded = True
        finally:
            _autoloading = False


def load(name: str | None = None) -> list[Family]:
    """Load the named family, or every installed one that is not blocked.

    Each family is loaded once; loading one again does nothing.

    **Arguments:**

    - `name`: an entry-point name, or `None` for all.

    **Returns:**

    The families that were asked for, with their state.
    """
    found = _discover()
    if name is not None:
        if name not in found:
            raise LookupError(
                f"No quax family named {name!r} is installed (installed: "
                f"{', '.join(sorted(found)) or 'none'})."
            )
        _blocked.discard(name)
        chosen = [found[name]]
    else:
        chosen = [f for f in found.values() if f.name not in _blocked]
    with _loading:
        for family in chosen:
            if family.state in ("available", "blocked"):
                _load_one(family)
    return chosen


def block(name: str) -> None:
    """Keep a family from being loaded automatically (it can still be loaded with
    `load(name)`). It must be called before the family loads.

    **Arguments:**

    - `name`: the family's entry-point name.

    **Returns:**

    Nothing.
    """
    _blocked.add(name)
    family = _discover().get(name)
    if family is not None and family.state == "available":
        family.state = "blocked"


def _load_one(family: Family, load: Callable[[], Any] | None = None) -> None:
    """Load `family` (its plugin from `load`, by default its entry point's), all or
    nothing: if it raises, what it added is taken back."""
    imported = set(sys.modules)
    context_size = trace_context_size()
    block = _journal.Block()
    try:
        with _journal.all_or_nothing() as block:
            plugin = (load or family.entry_point.load)()
            _manager.register(plugin, name=family.name)
            try:
                _manager.subset_hook_caller(
                    "quax_register_rules", remove_plugins=_others(plugin)
                )()
            except BaseException:
                _manager.unregister(plugin)
                raise
    except BaseException as e:
        _forget_new_modules(family, imported, block)
        if not isinstance(e, Exception):
            raise  # interrupted: the family stays available, to load next time
        family.state = "failed"
        family.error = f"{type(e).__name__}: {e}"
        warnings.warn(
            f"The quax family {family.name!r} (distribution {family.distribution} "
            f"{family.version}) failed to load and is disabled: {family.error}. "
            f"What it added to quax before the error ({len(block.take_backs)} "
            "rules, settings and value types) was taken back.",
            PluginWarning,
            stacklevel=3,
        )
    else:
        family.state = "loaded"
        family.plugin = plugin
        added = trace_context_size() - context_size
        if added > 0:
            warnings.warn(
                f"The quax family {family.name!r} (distribution "
                f"{family.distribution} {family.version}) added {added} "
                f"value{'s' if added > 1 else ''} to JAX's trace context as it "
                "loaded (a `jax.make_user_context`, or a JAX option included in "
                "the trace context, made at import): a `jax.jit` whose first call "
                "loads the families (the program's first quaxified call) then "
                "finds its cache key changed, and traces and compiles again on its "
                "next call. Make such a setting with "
                "`quax.plugins.jit_context(default)`, which adds nothing to JAX's "
                "trace context.",
                PluginWarning,
                stacklevel=3,
            )


def _forget_new_modules(
    family: Family, imported: set[str], block: _journal.Block
) -> None:
    """Forget the modules a failed load imported (those not in `imported`) that
    belong to the family, or to a package that added to quax's tables in the load
    (not quax's own), so that importing them again registers again."""
    core = __name__.partition(".")[0]
    packages = {m.partition(".")[0] for m in block.modules} - {core}
    for name in set(sys.modules) - imported:
        if family.owns(name) or name.partition(".")[0] in packages:
            sys.modules.pop(name, None)


def load_in_process(name: str, plugin: Any) -> Family:
    """Load `plugin` (an object implementing the hooks of `quax.hookspecs`) as the
    family `name`, without an entry point, as the loader loads an installed one.
    For tests of the loader (`quax.testing.assert_registration_all_or_nothing`):
    the family is not listed among the installed ones.

    **Arguments:**

    - `name`: the family's name.
    - `plugin`: the object implementing the hooks.

    **Returns:**

    The [`quax.plugins.Family`][], `"loaded"` or `"failed"`.
    """
    entry_point = importlib.metadata.EntryPoint(name, "<in process>", ENTRY_POINT_GROUP)
    family = Family(name, "<in process>", "0", entry_point, package="")
    with _loading:
        _load_one(family, lambda: plugin)
    return family


def _others(plugin: Any) -> list[Any]:
    return [p for p in _manager.get_plugins() if p is not plugin]


def _hook(family: Family, hook: str) -> Any:
    return _manager.subset_hook_caller(
        hook, remove_plugins=_others(family.plugin)
    ).__call__()


def value_types(family: Family) -> list[type]:
    """The value types a loaded family declares (empty if not loaded)."""
    if family.state != "loaded":
        return []
    return [t for result in _hook(family, "quax_value_types") for t in result]


def _aliases(family: Family) -> list[str]:
    if family.state != "loaded":
        return []
    return [a for result in _hook(family, "quax_example_aliases") for a in result]


def example_module(name: str) -> ModuleType:
    """The module `quax.examples.<name>` resolves to: the installed family with that
    entry-point name or alias.

    **Arguments:**

    - `name`: a family name or alias (`lora`, `unitful`, `structured_matrices`, ...).

    **Returns:**

    The family's public module.

    **Raises:**

    `ImportError` naming the distribution to install when no family provides `name`.
    """
    autoload()
    found = _discover()
    candidates = [found[name]] if name in found else list(found.values())
    for family in candidates:
        if family.state != "loaded" and family.name == name:
            load(name)
        if family.state == "loaded" and (
            family.name == name or name in _aliases(family)
        ):
            module = _hook(family, "quax_example_module")
            # Without the hook, the family's package.
            return module or importlib.import_module(family.package)
    family = found.get(name)
    if family is not None and family.state == "failed":
        raise ImportError(
            f"quax.examples.{name}: the family {name!r} ({family.distribution}) is "
            f"installed but failed to load: {family.error}"
        )
    distribution = KNOWN_DISTRIBUTIONS.get(name)
    hint = (
        f"install the distribution `{distribution}` (`pip install {distribution}`)"
        if distribution
        else "install a distribution that declares it in the `quax.rules` "
        "entry-point group"
    )
    raise ImportError(
        f"quax.examples.{name} is not available: {hint}.", name=f"quax.examples.{name}"
    )


def _reset_for_tests(names: Sequence[str] = ()) -> None:
    """Forget discovery (after installing a distribution in a test)."""
    global _families, _autoloaded
    _families = None
    _autoloaded = False
    _blocked.difference_update(names)
