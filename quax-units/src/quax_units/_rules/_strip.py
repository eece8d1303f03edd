"""The quax rules of the primitives behind `ustrip` (defined in `_strip.py`): they
read the quantity's numbers, checking its dimensions, and give derivatives their
units."""

from typing import Any

import quax
from jaxtyping import ArrayLike

from .._dimensions import Dimensions
from .._strip import _check_dimensions, per_unit_p, strip_p, tangent_strip_p
from .._units import si_unit
from .._value import Quantity, dimensions_of, make


@quax.register(strip_p)
def _strip(q: Quantity, *, dimensions: Dimensions) -> Any:
    _check_dimensions(dimensions, q.units)
    return q.array


@quax.register(tangent_strip_p)
def _tangent_strip(t: Quantity | ArrayLike, x: Quantity) -> Any:
    del x
    return t.array if isinstance(t, Quantity) else t


@quax.register(per_unit_p)
def _per_unit(ct: Quantity | ArrayLike, x: Quantity) -> Quantity:
    units = dimensions_of(ct) / x.units
    array = ct.array if isinstance(ct, Quantity) else ct
    return make(array, units, si_unit(units))
