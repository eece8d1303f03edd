"""The materialisation policy every family shares.

A family's value stands for a dense array that it does not store (LoRA's `w + a @ b`,
a sparse matrix, a tridiagonal matrix), or stores with something a dense array would
lose (units, axis names). Forming that dense array where no rule keeps the structure
is never silent: the value refuses, with a [`quax.MaterialisationError`][] whose
message starts with "Refusing to materialise", names the type and says the way out,
unless its `allow_materialise` flag is set. [`quax.GuardedValue`][] is that policy,
written once: families subclass it and add only their reason and their way out.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import equinox as eqx
import jax

from .._compat import Primitive
from .._foundation._owners import owner
from ._value import ArrayValue, Value, ValueLike, describe_types


__all__ = ["GuardedValue", "MaterialisationError"]


class MaterialisationError(RuntimeError):
    """A value refused to materialise: to become the dense array it stands for.

    The message starts with "Refusing to materialise" and names the value's type,
    as the published quax's refusals do (its clients match on that text), then says
    why and what to do. Every family's own error subclasses this one, so that
    `except quax.MaterialisationError` catches a refusal of any family; it is a
    `RuntimeError`, as the published quax's refusals are.
    """


class GuardedValue(ArrayValue):
    """An [`quax.ArrayValue`][] that refuses to materialise unless allowed.

    Subclass it, implement `aval()` and `dense()` (the dense array, whatever the
    policy says), and the value gains:

    - the static field `allow_materialise` (keyword-only, `False` by default);
    - `enable_materialise(allow=True)`: a copy with the flag set;
    - `materialise()`: `dense()` where allowed, else the refusal;
    - a refusing `default`: a primitive without a rule for the value's types
        raises the refusal naming the primitive and the input types, rather than
        densifying. Every subclass shares this one `default`, so values of two
        families that both follow the policy meet without ambiguity: the first
        value that refuses says so; where all allow it, every value is
        materialised and the primitive bound as usual.

    A family adds its own words through `refusal_reason()` (why densifying is
    refused: what it costs or loses) and `way_out(primitive)` (what to do), and its
    own error class through the class variable `materialisation_error` (a subclass
    of [`quax.MaterialisationError`][]).

    ```python
    class BandedMatrixError(quax.MaterialisationError):
        pass

    class BandedMatrix(quax.GuardedValue):
        bands: Array
        materialisation_error: ClassVar[type] = BandedMatrixError

        def aval(self): ...
        def dense(self): ...
    ```
    """

    allow_materialise: bool = eqx.field(default=False, static=True, kw_only=True)
    materialisation_error: ClassVar[type[MaterialisationError]] = MaterialisationError

    def dense(self) -> jax.Array:
        """The dense array this value stands for, whatever `allow_materialise` says.
        `materialise` calls it where materialising is allowed.

        **Returns:**

        A JAX array whose shape and dtype match `self.aval()`.
        """
        raise NotImplementedError(
            f"`{type(self).__qualname__}` follows quax.GuardedValue's policy but "
            "implements no `dense()`: define it to return the dense array."
        )

    def materialise(self) -> jax.Array:
        if not self.allow_materialise:
            raise self.refusal()
        return self.dense()

    def enable_materialise(self, allow: bool = True) -> Self:
        """A copy of this value with `allow_materialise=allow`.

        The copy is built field by field, as JAX rebuilds a pytree: the value's own
        `__init__` is not run again (it may draw random numbers or check inputs).

        **Arguments:**

        - `allow`: whether the copy may form its dense array.

        **Returns:**

        A value of the same type sharing every other field with this one.
        """
        out = object.__new__(type(self))
        for field in dataclasses.fields(self):
            object.__setattr__(out, field.name, getattr(self, field.name))
        object.__setattr__(out, "allow_materialise", bool(allow))
        return out

    def refusal_reason(self) -> str:
        """Why this value refuses to densify: what the dense array would cost or
        lose. Families override it (the base says the array is not stored).

        **Returns:**

        A sentence without a final full stop, such as "the dense array (shape
        (4096, 4096)) costs O(n^2) memory".
        """
        aval = self.aval()
        return (
            f"the dense array it stands for ({aval.str_short()}) is not stored, and "
            "forming it would cost what the structure saves"
        )

    def way_out(self, primitive: Primitive | None = None) -> str:
        """What the user can do instead of this refusal.

        **Arguments:**

        - `primitive`: the primitive that needed the dense array, or `None` when
            the value was materialised directly.

        **Returns:**

        One or more sentences. The base names the flag and `enable_materialise`;
        families add their own ways (a conversion, a merge, the rule that is
        missing).
        """
        del primitive
        name = type(self).__qualname__
        return (
            f"Pass `allow_materialise=True` to `{name}` or call "
            "`.enable_materialise()` to allow the dense array."
        )

    def refusal(
        self,
        primitive: Primitive | None = None,
        values: Sequence[ValueLike] | None = None,
    ) -> MaterialisationError:
        """The error this value raises when it refuses to materialise.

        **Arguments:**

        - `primitive`: the primitive that needed the dense array (no rule matched
            its input types), or `None` when the value was materialised directly.
        - `values`: that primitive's inputs, to name their types.

        **Returns:**

        An instance of the class's `materialisation_error`, whose message starts
        with "Refusing to materialise `<type>`", then names the primitive and the
        input types (where given), the reason and the way out.
        """
        name = type(self).__qualname__
        if primitive is None:
            where = "with `allow_materialise=False`"
        else:
            types = describe_types(values or ())
            where = (
                f"for primitive `{primitive.name}` on input types ({types}): "
                f"{owner(type(self))} has no rule for this case"
            )
        return type(self).materialisation_error(
            f"Refusing to materialise `{name}` {where}, and "
            f"{self.refusal_reason()}. {self.way_out(primitive)}"
        )

    @staticmethod
    def default(
        primitive: Primitive, values: Sequence[ValueLike], params: dict[str, Any]
    ) -> ValueLike | Sequence[ValueLike]:
        for value in values:
            if isinstance(value, GuardedValue) and not value.allow_materialise:
                raise value.refusal(primitive, values)
        return Value.default(primitive, values, params)
