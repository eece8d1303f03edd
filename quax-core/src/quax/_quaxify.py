"""`quax.quaxify`: run a JAX program with its primitives dispatched on value types."""

import functools as ft
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import PyTree

from . import _plugins
from ._compat import EQX_WRAPPER_FIELD_NAMES, eqx_warn_transformed_function
from ._trace import QuaxTrace, run_nested
from ._values import is_value


__all__ = ["quaxify"]

_CT = TypeVar("_CT", bound=Callable[..., Any])


def _call(trace: QuaxTrace, filter_spec: Any, leaves: list[Any], treedef: Any) -> Any:
    """Call `fn(*args, **kwargs)` (flattened in `leaves`, `treedef`) with its values
    (those `filter_spec` selects) as `trace`'s tracers."""
    if filter_spec is True:
        fn, args, kwargs = jtu.tree_unflatten(treedef, [trace.wrap(x) for x in leaves])
    else:
        tree = jtu.tree_unflatten(treedef, leaves)
        wrap = ft.partial(jtu.tree_map, trace.wrap, is_leaf=is_value)
        dynamic, static = eqx.partition(tree, filter_spec, is_leaf=is_value)
        fn, args, kwargs = eqx.combine(wrap(dynamic), static, is_leaf=is_value)
    return fn(*args, **kwargs)


class _Quaxify(eqx.Module, Generic[_CT]):
    fn: _CT
    filter_spec: PyTree[bool | Callable[[Any], bool]]

    @property
    def __wrapped__(self) -> _CT:
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _plugins.autoload()
        filter_spec = self.filter_spec
        leaves, treedef = jtu.tree_flatten((self.fn, args, kwargs), is_leaf=is_value)
        if filter_spec is True and not any(map(is_value, leaves)):
            # No value to dispatch on: run the function as it is, untraced, so that
            # functions with data-dependent shapes (`jnp.unique`, ...) keep working.
            return self.fn(*args, **kwargs)
        return run_nested(lambda trace: _call(trace, filter_spec, leaves, treedef))

    def __get__(self, instance: Any, owner: Any) -> Any:
        if instance is None:
            return self
        return eqx.Partial(self, instance)


def quaxify(fn: _CT, filter_spec: PyTree[bool | Callable[[Any], bool]] = True) -> _CT:
    """Make `fn` understand [`quax.Value`][]s: each primitive it binds on one is
    dispatched to the rule registered for the input types.

    ```python
    lora_linear = eqx.tree_at(lambda l: l.weight, linear, lora.LoraArray(...))
    y = quax.quaxify(lambda m, x: m(x))(lora_linear, x)
    ```

    It composes with JAX's transforms in both orders (`jax.jit(quax.quaxify(f))` and
    `quax.quaxify(jax.jit(f))`, likewise `grad`, `vmap`, ...), and with itself.

    **Arguments:**

    - `fn`: the function to transform; it need not know about quax.
    - `filter_spec`: which of `(fn, args, kwargs)` to dispatch on, as for
        `eqx.partition`. Values that it leaves out pass through unchanged, typically to
        reach a nested `quaxify`.

    **Returns:**

    A callable `equinox.Module` with the signature of `fn`. Called with no `Value`
    among the selected inputs, it runs `fn` unchanged.
    """
    # What `eqx.module_update_wrapper(_Quaxify(fn, filter_spec))` builds, at a
    # fraction of its cost (see `benchmarks/README.md`), as `quax.quaxify(f)(x)` is
    # often written inline: the fields, then `fn`'s name, docstring, ... where
    # equinox's flattening keeps them.
    eqx_warn_transformed_function(_Quaxify, fn)
    wrapper = object.__new__(_Quaxify)
    attributes: dict[str, Any] = vars(wrapper)
    attributes["fn"] = fn
    attributes["filter_spec"] = filter_spec
    for name in EQX_WRAPPER_FIELD_NAMES:
        value = getattr(fn, name, _MISSING)
        if value is not _MISSING:
            attributes[name] = value
    return cast(_CT, wrapper)


_MISSING = object()
