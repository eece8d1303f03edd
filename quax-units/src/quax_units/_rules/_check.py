"""The quax rule of `check_p` (defined in `_check.py`), the primitive behind
`check_units`: it checks a traced quantity's dimensions and passes it on."""

import quax

from .._check import check_dimensions, check_p, shown
from .._dimensions import Dimensions
from .._value import Quantity


@quax.register(check_p)
def _check(
    q: Quantity, *, dimensions: Dimensions, where: str, expected: str
) -> Quantity:
    check_dimensions(
        q.units, shown(q), dimensions=dimensions, where=where, expected=expected
    )
    return q
