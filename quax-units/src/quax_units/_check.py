"""`check_units`: a decorator that checks the dimensions of a function's arguments
and return value when it is called (at trace time under `jax.jit`), and `check_p`,
the primitive that carries the check through `quax.quaxify` and JAX's transforms
(its quax rule, on quantities, is in `_rules/_check.py`)."""

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.core
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir
from quax.extend import define_batching_rule

from ._dimensions import Dimensions, UnitError, dimensionless
from ._units import UnitLike, unit
from ._value import Quantity


__all__ = ["check_dimensions", "check_p", "check_units", "shown"]

_F = TypeVar("_F", bound=Callable[..., Any])


def check_dimensions(
    got: Dimensions, shown: str, *, dimensions: Dimensions, where: str, expected: str
) -> None:
    """Raise the error of `check_units` unless `got` is `dimensions`.

    **Arguments:**

    - `got`: the dimensions of the value.
    - `shown`: the value as the message shows it (`km / s [m / s]`).
    - `dimensions`: the dimensions it must have.
    - `where`: which value it is (`argument `x` of `f``).
    - `expected`: the unit it was declared in (`m`).

    **Returns:**

    Nothing; raises [`quax_units.UnitError`][].
    """
    if got == dimensions:
        return
    if dimensions.is_dimensionless:
        raise UnitError(
            f"check_units: {where} must be dimensionless (a plain array, a number "
            f"or a dimensionless quantity), but got {shown} (dimensions {got}). "
            "Strip its units with `quax_units.ustrip(unit, q)` if its number in "
            "some unit is meant."
        )
    raise UnitError(
        f"check_units: {where} must have dimensions {dimensions} (those of "
        f"{expected}), but got {shown} ("
        f"{'dimensionless' if got.is_dimensionless else f'dimensions {got}'}). "
        f"Pass a quantity in {expected} or in any unit of those dimensions (its "
        f"numbers are not converted), e.g. `quax_units.Quantity(value, "
        f"{expected!r})`."
    )


def _plain(x: Any) -> str:
    if type(x) in (bool, int, float, complex):
        return f"the plain number {x!r}"
    aval = x if isinstance(x, jax.core.AbstractValue) else jax.typeof(x)
    return f"a plain array {aval.str_short()}"


def shown(q: Quantity) -> str:
    """A quantity as the message of `check_units` shows it: `a quantity in km`."""
    return f"a quantity in {str(q.unit) or 'dimensionless units'}"


# `check_p`: the check, under transforms -----------------------------------------------
#
# An identity. Bound on a tracer, so that inside `quax.quaxify` its rule sees the
# quantity itself; on plain arrays (outside quaxify, or a plain argument inside it)
# its evaluation and abstract evaluation check that the value may be dimensionless.

check_p = Primitive("quax_units_check")


def _check_plain(x: Any, **params: Any) -> Any:
    check_dimensions(dimensionless, _plain(x), **params)
    return x


def _check_jvp(primals: Any, tangents: Any, **params: Any) -> Any:
    # The tangent has the primal's units (or is a symbolic zero): it passes.
    return check_p.bind(primals[0], **params), tangents[0]


def _check_batch(args: Any, axes: Any, **params: Any) -> Any:
    return check_p.bind(args[0], **params), axes[0]


check_p.def_impl(_check_plain)
check_p.def_abstract_eval(_check_plain)
ad.primitive_jvps[check_p] = _check_jvp
define_batching_rule(check_p, _check_batch)
mlir.register_lowering(
    check_p, mlir.lower_fun(lambda x, **params: x, multiple_results=False)
)


def _check_leaf(x: Any, **params: Any) -> Any:
    if isinstance(x, Quantity):
        check_dimensions(x.units, shown(x), **params)
        return x
    if isinstance(x, jax.core.Tracer):
        # Inside `quax.quaxify` (its rule checks the quantity), or a plain tracer.
        return check_p.bind(x, **params)
    if isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex)):
        check_dimensions(dimensionless, _plain(x), **params)
        return x
    raise UnitError(
        f"check_units: {params['where']} must be a quantity of dimensions "
        f"{params['dimensions']} (or an array, where dimensionless), but got "
        f"{type(x).__name__} {x!r}."
    )


def _check_tree(tree: Any, **params: Any) -> Any:
    return jax.tree.map(
        lambda x: _check_leaf(x, **params),
        tree,
        is_leaf=lambda x: isinstance(x, Quantity),
    )


def check_units(
    return_: UnitLike | None = None, **units: UnitLike
) -> Callable[[_F], _F]:
    """Check the dimensions of a function's arguments (and of its return value)
    whenever it is called, as pint's `@wraps` check and astropy's
    `@quantity_input` do.

    ```python
    import quax_units
    from quax_units import Quantity

    @quax_units.check_units(x="m", t="s", return_="m / s")
    def speed(x, t):
        return x / t

    speed(Quantity(3.0, "km"), Quantity(2.0, "h"))  # km is a length: accepted
    speed(Quantity(3.0, "km"), Quantity(2.0, "m"))  # UnitError naming `t`
    ```

    A value passes when it has the dimensions of the declared unit, in any unit of
    them (`km` for `m`, `degC` for `K`); its numbers are not converted (a
    `Quantity` holds SI-coherent numbers whatever its unit). The check runs when
    the function is called, so under `jax.jit` when it is traced, and costs
    nothing at run time. It works on quantities outside `quax.quaxify` (also
    traced by `jit`, `vmap` or `grad` there), and on the traced values inside it,
    under `jit`, `vmap` and `grad`.

    Plain arrays and Python numbers count as dimensionless: they pass where the
    declared unit is dimensionless (`""`, `"dimensionless"`, `"%"`, `"rad"`), and
    are refused everywhere else. An argument that is a pytree (a tuple, a dict, a
    `*args`) is checked leaf by leaf. An argument whose default is `None` may be
    left out or passed as `None`.

    **Arguments:**

    - `return_`: the unit the return value must have the dimensions of (each of its
        leaves, for a pytree); `None` (default) checks nothing.
    - `**units`: the unit each named argument must have the dimensions of: a unit
        string (`"m / s"`), a `Unit`, a `Dimension` or a mapping from `Dimension`
        to exponent.

    **Returns:**

    A decorator. The decorated function raises [`quax_units.UnitError`][] naming
    the argument (or the return value), the function, the declared unit and
    dimensions, and what it got. Decorating a function that has no argument of a
    name given raises `ValueError`.
    """
    declared = {name: unit(u) for name, u in units.items()}
    returned = None if return_ is None else unit(return_)

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)
        name = getattr(fn, "__qualname__", repr(fn))
        unknown = [n for n in declared if n not in signature.parameters]
        if unknown:
            raise ValueError(
                f"check_units: `{name}` has no argument "
                f"{', '.join(repr(n) for n in unknown)}; its arguments are "
                f"{', '.join(repr(n) for n in signature.parameters) or 'none'}."
            )

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            for arg, u in declared.items():
                value = bound.arguments[arg]
                if value is None and signature.parameters[arg].default is None:
                    continue
                bound.arguments[arg] = _check_tree(
                    value,
                    dimensions=u.dimensions,
                    where=f"argument `{arg}` of `{name}`",
                    expected=str(u),
                )
            out = fn(*bound.args, **bound.kwargs)
            if returned is None:
                return out
            return _check_tree(
                out,
                dimensions=returned.dimensions,
                where=f"the return value of `{name}`",
                expected=str(returned),
            )

        return checked  # type: ignore[return-value]

    return decorate
