"""The values quax dispatches on, and materialisation tracking."""

import abc
import contextlib
import contextvars
import dataclasses
import functools as ft
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from types import MethodType
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeGuard

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from .._compat import (
    Primitive,
    ShapedArray,
    eqx_bound_method,
    reflected_operator,
    typeof,
)
from .._foundation import _journal
from ._avals import declared_aval
from ._constructors import ValueMeta


__all__ = [
    "ArrayValue",
    "MaterialisationReport",
    "PlainRunMetValue",
    "Value",
    "ValueLike",
    "describe",
    "describe_types",
    "is_value",
    "materialise_or_explain",
    "materialise_outside_quax",
    "plain_running",
    "set_jax_array_conversion",
    "structure",
    "track_materialisation",
]


_object_getattribute = object.__getattribute__

# Every subclass of `Value`: `type(x) in value_classes` is the cheap half of
# `is_value(x)`.
value_classes: set[type] = set()
# The subclasses whose attribute lookup goes through `super().__getattribute__`.
_inherited_lookup: set[type] = set()


def _is_magic(name: str) -> bool:
    return (name.startswith("__") and name.endswith("__")) or name == "_abc_impl"


class Value(eqx.Module, metaclass=ValueMeta):
    """An object that quax dispatches on.

    Subclass it (usually through [`quax.ArrayValue`][]) and implement `aval` and
    `materialise`. Rules for it are registered with [`quax.register`][]; primitives
    without a rule fall back to `default`.

    **Custom derivatives.** A value type counts as linear in its leaves: its
    `materialise` is a linear function of its floating-point leaves (a dense
    wrapper, a symbolic zero, sparse data, units). A `custom_jvp`/`custom_vjp`
    function (`jax.nn.relu`, `jnp.logaddexp`, ...) then runs its custom rule on the
    values themselves, with tangents and cotangents of the same type rebuilt from
    the leaves' tangents, as the published quax does (a type whose static fields
    are a scale of its numbers, such as units, relabels the cotangents through
    `cotangent`). A type whose array is *not*
    linear in its leaves (a low-rank product, quantised data) must declare the
    class variable `linear_in_leaves = False`: such functions then see its
    materialised array (or the type's refusal to materialise, as a
    `RuntimeError`), unless the type overrides `tangent`, which keeps it whole. A
    type may also replace a custom-JVP function's rule with its own
    (`custom_jvp_rule`), e.g. to differentiate its own algorithm.
    """

    linear_in_leaves: ClassVar[bool] = True
    # The field whose aval is this value's (see `aval`), or `None`.
    aval_leaf: ClassVar[str | None] = None

    if not TYPE_CHECKING:

        def __getattribute__(self, name: str, /) -> Any:
            # Equinox's `Module.__getattribute__` (methods become `BoundMethod`
            # pytrees) at less cost, as rules read fields on the hot path: it
            # reads the attribute with `object.__getattribute__`, which is what
            # `super()` reaches unless a base after `Value` has its own lookup.
            # `type(out) is MethodType` is `isinstance`: `MethodType` has no
            # subclasses.
            if type(self) in _inherited_lookup:
                return super().__getattribute__(name)
            out = _object_getattribute(self, name)
            if type(out) is MethodType and out.__self__ is self and not _is_magic(name):
                return eqx_bound_method(out.__func__, self)
            return out

    @abc.abstractmethod
    def aval(self) -> Any:
        """The abstract value JAX sees for this object.

        It must be pure: the same instance always gives the same aval. Python metadata
        that changes it belongs in static fields. Quax calls it for every value a rule
        returns, so keep it cheap: where a leaf has the value's shape and dtype,
        `return jax.typeof(leaf)` is cheaper than building a new `ShapedArray`.

        **Declared avals.** When the aval is exactly one field's (its `jax.typeof`,
        or its own `aval()` when the field holds a value), declare that field:

        ```python
        class Scaled(quax.ArrayValue):
            array: jax.Array
            scale: float = eqx.field(static=True)
            aval_leaf: ClassVar[str] = "array"

            def aval(self):
                return jax.typeof(self.array)
        ```

        Quax then replaces `aval` with one that reads the field directly, with no
        call into user code: the fastest way for a trace to learn a value's type.
        The declared aval keeps the leaf's weak type, as JAX does for the dense
        array. The method you wrote stays as the reference: under
        [`quax.set_debug_checks`][] every declared aval is compared with it (shape,
        dtype and weak type), and a difference raises a `TypeError` naming the class
        and the field. (Without a method the class still works, but static type
        checkers count it as abstract.) Naming a field that does not exist, or a
        static one, is a `TypeError` when the class is created.

        **Returns:**

        A JAX abstract value, typically a `jax.core.ShapedArray`.
        """

    @abc.abstractmethod
    def materialise(self) -> Any:
        """The dense JAX array this object represents.

        Raise here (naming the type and how to allow it) if densifying would be too
        costly or would lose information.

        **Returns:**

        A JAX array whose shape and dtype match `self.aval()`.
        """

    @staticmethod
    def default(
        primitive: Primitive, values: Sequence["ValueLike"], params: dict[str, Any]
    ) -> "ValueLike | Sequence[ValueLike]":
        """The rule used when no registered rule matches.

        For `primitive.bind(*values, **params)`, quax uses, in order: a registered
        rule matching the input types; else the `default` of the single input type
        that overrides this method; else it materialises every `Value` and binds the
        primitive as usual. Two input types overriding it with different functions
        is a `TypeError`; types sharing one `default` (every [`quax.GuardedValue`][]
        shares its refusing one) let it decide.

        **Arguments:**

        - `primitive`: the primitive being bound.
        - `values`: its inputs, each a `Value` or a JAX array-like.
        - `params`: the primitive's parameters.

        **Returns:**

        The primitive's output: one value, or a sequence of them when
        `primitive.multiple_results` is true.
        """
        dense = [v.materialise() if isinstance(v, Value) else v for v in values]
        return primitive.bind(*dense, **params)

    @staticmethod
    def custom_jvp_rule(
        name: str, fun: Callable[..., Any], values: Sequence["ValueLike"]
    ) -> Callable[..., Any] | None:
        """A JVP rule replacing a `jax.custom_jvp` function's own, or `None` (the
        default: the function's own rule, see the class docstring).

        A custom rule is written for dense arrays: `jnp.linalg.slogdet`'s computes
        `trace(solve(A, dA))`, `det`'s a cofactor solve, each of the full tangent
        `dA`. A structure whose own algorithm costs less answers with a rule that
        differentiates that algorithm, e.g. `jax.jvp` of `fun` over the leaves.
        The call is still a custom-JVP call over the leaves: only its rule
        changes. Quax asks each input whose type overrides this method, in input
        order, until one returns a rule; with a rule no input is materialised.

        **Arguments:**

        - `name`: the function's name as JAX records it: the decorated function's
            `__name__` (for `jnp.linalg.slogdet` of an `n x n` matrix with n > 2,
            JAX's private `"_slogdet_lu"`; for `det` with n > 3, `"_det"`). Keying
            on a private name is safe: a rename brings back the default rule.
        - `fun`: the function as a callable on values, run under quax (its body's
            primitives dispatched to the rules): `fun(*values)` gives its outputs.
        - `values`: the inputs, each a `Value` or an array. Decide from types and
            static fields; compute nothing here.

        **Returns:**

        `None`, or `rule(primals, tangents) -> (outputs, output_tangents)`: JAX's
        JVP rule over values. `primals` are the inputs; `tangents` their tangents:
        for a value, a value of its type holding its leaves' tangents (zeros where
        a leaf has none; never materialised, so a structure's tangent keeps its
        structure), for an array an array. It returns the outputs (values or
        arrays, as `fun` gives them) and their tangents (arrays, or values of the
        output's type holding the leaves' tangents), linear in `tangents`:
        reverse mode transposes them. An output whose tangent is such a value
        leaves the call as it is, even of a type that is not linear in its leaves
        (with the function's own rule it would be materialised); one whose
        tangent is an array is materialised.
        """
        del name, fun, values
        return None

    @classmethod
    def lift(cls, array: ArrayLike, like: "Value") -> "Value | None":
        """`array` (a plain array, possibly a tracer) as a value of type `cls` with the
        static metadata of `like`, or `None` to decline.

        Quax calls it to join a loop carry, branch output or linear-solve right-hand
        side that is plain on one side and a `cls` on the other (e.g. the zero
        cotangent a reverse-mode loop starts with), before falling back to
        materialising. `like`'s leaves are `jax.ShapeDtypeStruct`s: use only its
        type and static fields. The default declines.

        **Arguments:**

        - `array`: the plain array.
        - `like`: a value of type `cls` with the target structure.

        **Returns:**

        A value of `like`'s pytree structure, or `None`.
        """
        del array, like
        return None

    @classmethod
    def join(cls, value: "Value", other: "Value") -> "Value | None":
        """`value` (a `cls`) converted to a structure it shares with `other` (the
        same array; e.g. the weaker of two sets of static flags), or `None` to
        decline (the default). Quax calls it where a loop carry, branch output or
        linear-solve right-hand side is a value on both sides whose structures
        differ, converting the input (`join(carry, output)`) and then the body's
        outputs (`join(output, joined)`) until they agree, before materialising.
        `other`'s leaves may be `jax.ShapeDtypeStruct`s: read only its type and
        static fields.

        **Arguments:**

        - `value`: a value of this class (`cls`), on one side of the join: the
            loop's carry, a branch's output, a right-hand side.
        - `other`: the value on the other side, of this class or another; only its
            type and static fields may be read (its leaves may be
            `jax.ShapeDtypeStruct`s).

        **Returns:**

        A value holding `value`'s array in the common structure, or `None`.
        """
        del value, other
        return None

    def tangent(self, dot: "Value") -> "ValueLike":
        """The tangent of this value's array, given its leaves' tangents: what a
        `custom_jvp` rule receives beside it, and what maps a `custom_vjp` rule's
        cotangent back onto the leaves (by transposition).

        The default, `dot` itself, is exact for a type linear in its leaves. A type
        that is *not* linear (`linear_in_leaves = False`) and overrides this method
        enters custom derivatives whole, rather than materialised: e.g. `D + U Uᵀ`
        returns `dD + dU Uᵀ + U dUᵀ` (as a value, or as a dense array). Any type
        may override it to give its custom rules another tangent (e.g. a dense one
        where its rules need the dense array).

        It must be linear in `dot`'s floating-point leaves (quax transposes it for
        reverse mode), and return a value or array of this value's shape.

        **Arguments:**

        - `dot`: a value of this type holding the tangents of the floating-point
            leaves (zeros where a leaf has none) and this value's other leaves.

        **Returns:**

        The tangent: a value, or a JAX array of this value's shape.
        """
        return dot

    def cotangent(self, bar: "Value") -> "Value":
        """The cotangent of this value that a `custom_vjp` rule receives, given its
        leaves' cotangents; also the structure in which quax reads the rule's
        cotangent of an input of this type back onto its leaves.

        The default, `bar` itself, is right where the static fields describe the
        array's structure (indices, shapes, flags): the cotangent is an array of
        the same structure. A type whose static fields give the numbers a scale
        overrides it: a quantity in metres has a cotangent per metre (`dL/dy` is in
        `1/m` for a dimensionless `L`), which the rule's own arithmetic with the
        residuals (`ct * y`) needs for its units to agree. Reverse mode inside
        `quax.quaxify` gives such cotangents through the type's own rules; this
        method gives the ones that enter a custom rule from outside it.

        It must return a value of this type with `bar`'s leaves, in the same
        order: only static fields may differ. Quax calls it on each output's
        cotangent, and on the input itself for the structure a cotangent of that
        input must have: a cotangent the rule returns in that structure gives its
        leaves as the leaves' cotangents; any other is materialised and
        transposed as a dense cotangent (see `tangent`).

        **Arguments:**

        - `bar`: a value of this type holding the cotangents of the floating-point
            leaves and this value's other leaves, with this value's static fields.

        **Returns:**

        The cotangent: a value of this type with `bar`'s leaves.
        """
        return bar

    def __jax_array__(self) -> Any:
        """What this value is where a JAX function asks for an array: `jnp.where`,
        `jnp.stack`, `jnp.clip`, ... (every function that checks its arguments), and
        a JAX array's operators (`M + value` on a tracer `M`).

        Inside a quaxified function it is the value itself, lifted into the active
        quax trace, as JAX lifts a constant into the trace of the tracer it meets:
        the function then runs on it by the rules, and a value built inside the
        function (`jnp.where(x > q, x, Quantity(0.0, "m"))`) keeps its type.
        That holds in a quaxified function called with plain arrays alone too (see
        [`quax.quaxify`][]). Outside any quax trace (code outside `quax.quaxify`)
        it is the value's materialisation, under its policy: a
        [`quax.GuardedValue`][] refuses with its [`quax.MaterialisationError`][]
        unless allowed. What `materialise` raises there is also a `TypeError`, as
        JAX's refusal of anything that is not an array is (and as the published
        quax, which defines no `__jax_array__`, raises): an error of a class
        subclassing both its own class and `TypeError`, chained to it, its message
        ending with why the rules did not apply.

        A JAX array's binary operator (`jnp.ones(3) * q`) asks first, before
        Python tries the value's reflected operator. Where the value's type defines
        that operator (`__rmul__`), the value declines (it gives itself, not an
        array, so JAX's operator returns `NotImplemented`) and Python calls it.

        **Returns:**

        A tracer of the active quax trace, or a JAX array.
        """
        reflected = reflected_operator(sys._getframe(1))
        if reflected is not None and _defines_operator(type(self), reflected):
            return self
        return _jax_array_conversion(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        value_classes.add(cls)
        # A family that fails to load takes its value types back
        # (`quax._foundation._journal`).
        _journal.record(ft.partial(_forget_class, cls), cls.__module__)
        # A base after `Value` with its own `__getattribute__` (other than equinox's,
        # which `Value.__getattribute__` repeats) keeps the lookup through it.
        after = cls.__mro__[cls.__mro__.index(Value) + 1 :]
        lookups = [k for k in after if "__getattribute__" in vars(k)]
        if any(k is not eqx.Module and k is not object for k in lookups):
            _inherited_lookup.add(cls)
        # Record every materialisation while a `track_materialisation` block is
        # active. The wrapper costs one attribute read when nothing is tracked.
        own = cls.__dict__.get("materialise")
        if own is not None and not getattr(own, "__isabstractmethod__", False):
            setattr(cls, "materialise", _tracked(own))  # noqa: B010
        if cls.aval_leaf is not None:
            aval = declared_aval(cls, cls.aval_leaf, value_classes)
            setattr(cls, "aval", aval)  # noqa: B010


def set_jax_array_conversion(convert: Callable[[Value], Any]) -> None:
    """Make `convert(value)` what `Value.__jax_array__` gives: `quax._transform._trace`
    sets the lift into the active quax trace, which materialises outside one."""
    global _jax_array_conversion
    _jax_array_conversion = convert


# `_defines_operator`'s answers, by value type and method name.
_operators_defined: dict[tuple[type, str], bool] = {}


def _defines_operator(cls: type, name: str) -> bool:
    """Whether the method `name` that Python finds on the value type `cls` is the
    type's own: defined by `cls` or one of its bases other than `Value`'s own bases
    (`eqx.Module`, `object`, ...). The base may come after `Value` in `cls`'s method
    resolution order, as a mixin listed after `quax.ArrayValue` among a type's bases
    does (unxt's `Quantity` gains `__radd__` so, from quaxed's operator mixins)."""
    try:
        return _operators_defined[cls, name]
    except KeyError:
        pass
    owner = next((base for base in cls.__mro__ if name in vars(base)), None)
    defined = owner is not None and owner not in Value.__mro__
    _operators_defined[cls, name] = defined
    return defined


def _forget_class(cls: type) -> None:
    value_classes.discard(cls)
    _inherited_lookup.discard(cls)
    for key in [k for k in _operators_defined if k[0] is cls]:
        del _operators_defined[key]


ValueLike: TypeAlias = Value | ArrayLike


def is_value(x: Any) -> TypeGuard[Value]:
    """Whether `x` is a [`quax.Value`][]."""
    # `isinstance` alone goes through the slower `ABCMeta.__instancecheck__`.
    return type(x) in value_classes or isinstance(x, Value)


class ArrayValue(Value):
    """A [`quax.Value`][] that represents an array: it gains `shape`, `dtype`, `ndim`
    and `size` from its `aval`, which must be a `jax.core.ShapedArray`."""

    @abc.abstractmethod
    def aval(self) -> ShapedArray:
        """See [`quax.Value.aval`][]."""

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval().shape

    @property
    def dtype(self) -> Any:
        return self.aval().dtype

    @property
    def ndim(self) -> int:
        return self.aval().ndim

    @property
    def size(self) -> int:
        return self.aval().size


def describe(x: Any) -> str:
    """How errors name `x`: a value's type and aval, or a plain array's aval
    (`array float32[3]`), whatever JAX's own type for it (a NumPy or JAX array, a
    tracer, a jaxpr's literal)."""
    if isinstance(x, Value):
        return f"{type(x).__qualname__} {x.aval().str_short()}"
    if isinstance(x, jax.ShapeDtypeStruct):
        return f"array {x.dtype.name}{list(x.shape)}"
    return f"array {typeof(x).str_short()}"


def structure(tree: Any) -> Any:
    """What must agree between values that stand in for one another (loop
    iterations, branches, the cases of a `select_n`): the pytree structure (value
    types and static metadata included) and each leaf's shape and dtype."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((np.shape(x), jnp.result_type(x)) for x in leaves)


def describe_types(values: Sequence[Any]) -> str:
    """How errors name the input types of a primitive: a value by its type, a plain
    array as `describe` does (`array float32[3]`), a type (as `quax.resolve` takes
    them) by its name; comma-separated.

    **Arguments:**

    - `values`: the inputs, or their types.

    **Returns:**

    A string such as `"LoraArray, array float32[3]"`.
    """
    return ", ".join(
        v.__qualname__
        if isinstance(v, type)
        else type(v).__qualname__
        if isinstance(v, Value)
        else describe(v)
        for v in values
    )


def materialise_or_explain(
    x: Any,
    context: Callable[[str], str],
    advice: str = "",
    error: type[Exception] = TypeError,
) -> Any:
    """`x` materialised when it is a value (anything else unchanged), or an error
    saying why quax had to materialise it.

    **Arguments:**

    - `x`: a value or a plain array.
    - `context`: given `describe(x)`, why quax must materialise it.
    - `advice`: appended after the value's own error: what the user can do.
    - `error`: the exception type raised, chained to the value's own error.

    **Returns:**

    The dense array.
    """
    if not isinstance(x, Value):
        return x
    try:
        return x.materialise()
    except Exception as e:
        if isinstance(e, RuntimeError):
            # A refusal keeps the published contract (a `RuntimeError` with the
            # type's own text, "Refusing to materialise ..."), whatever `error` is.
            error = _refusal_error(error)
        raise error(f"{context(describe(x))}, and that failed: {e}{advice}") from e


def _refusal_error(error: type[Exception]) -> type[Exception]:
    """`error`, or a subclass of it that is also a `RuntimeError`."""
    if issubclass(error, RuntimeError):
        return error
    return _both(
        error,
        RuntimeError,
        f"Refused{error.__name__}",
        f"A `{error.__name__}` caused by a value's refusal to materialise.",
    )


# `_both`'s classes, by their two bases.
_combined_errors: dict[tuple[type[Exception], type[Exception]], type[Exception]] = {}


def _both(
    first: type[Exception], second: type[Exception], name: str, doc: str
) -> type[Exception]:
    """An exception class subclassing `first` and `second` (one per pair), so that
    an error of `first` is caught as a `second` too."""
    try:
        return _combined_errors[first, second]
    except KeyError:
        bases = (first, second)
        cls = type(name, bases, {"__doc__": doc, "__module__": "quax"})  # pyright: ignore[reportGeneralTypeIssues]
        _combined_errors[first, second] = cls
        return cls


# Outside any quax trace ---------------------------------------------------------------

# Appended to what a value's `materialise` raises where the value met JAX outside any
# quax trace.
_OUTSIDE_A_TRACE = (
    " (This value met JAX outside any quax trace: code outside `quax.quaxify` "
    "runs as plain JAX. Pass the value into a quaxified function, or build it "
    "inside one, for its rules to apply.)"
)


class PlainRunMetValue(BaseException):
    """A value met JAX outside any quax trace while a quaxified function runs plain
    (`plain_running`): the function runs again under quax (see
    `quax._transform._quaxify`).

    A `BaseException`, as `GeneratorExit` is, so that the function's own `except
    Exception` never takes it for an error of its own."""


# Whether a quaxified function runs plain now: called with no value among its
# arguments (see `quax._transform._quaxify`), outside any quax trace. Set
# and reset with `plain_running.set` and `.reset` (each a C call: this is on the
# path of every such call); a new quax trace resets it for its duration, so that
# only a value meeting JAX in the function's own code counts.
plain_running: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "quax_plain_running", default=False
)


def materialise_outside_quax(value: Value, type_error: bool = True) -> Any:
    """`value` where it meets JAX outside any quax trace (`Value.__jax_array__`, or a
    primitive bound on it): while a quaxified function runs plain
    (`plain_running`), the signal to run it again under quax; else its
    materialisation, under its policy.

    What the value's `materialise` raises there ends with why the rules did not
    apply. With `type_error` it is also a `TypeError`, as JAX's own refusal of a
    value that is not an array is (the published quax defines no `__jax_array__`,
    so its clients catch a `TypeError` from `jnp.square(q)`): the error itself
    where it is one, else an error of a class subclassing both its class and
    `TypeError`, with its arguments and attributes, chained to it, so that a
    refusal stays a `RuntimeError` saying "Refusing to materialise". Without
    `type_error` (for `Primitive.bind`, which replaces any `TypeError` of its
    arguments' conversion with its own message) it is the error itself.
    """
    if plain_running.get():
        raise PlainRunMetValue
    try:
        return type(value).materialise(value)
    except Exception as error:
        if not type_error or isinstance(error, TypeError):
            _explain_outside(error)
            raise
        cls = type(error)
        outside = _both(
            cls,
            TypeError,
            f"{cls.__name__}OutsideQuax",
            f"A `{cls.__name__}` raised by a value's `materialise` where the value "
            "met JAX outside any quax trace; also a `TypeError`, as JAX's refusal "
            "of a value that is not an array is.",
        )
        # The same error, of the combined class: `__init__` is not run again (its
        # signature is the original class's), its arguments and attributes copied.
        again = BaseException.__new__(outside)
        again.__dict__.update(vars(error))
        again.args = error.args
        _explain_outside(again)
        raise again from error


def _explain_outside(error: BaseException) -> None:
    """Append why the rules did not apply to `error`'s message."""
    if error.args and isinstance(error.args[0], str):
        error.args = (error.args[0] + _OUTSIDE_A_TRACE, *error.args[1:])


# How a value answers `__jax_array__`: set by `quax._transform._trace`, which knows the
# quax traces (see `set_jax_array_conversion`); until then, as outside any.
_jax_array_conversion: Callable[[Value], Any] = materialise_outside_quax


# Materialisation tracking ------------------------------------------------------------


@dataclasses.dataclass
class MaterialisationReport:
    """What a block of code materialised: a count per (primitive name, value type).

    The primitive is the one quax was dispatching when the value was densified
    (`"<outside>"` when it happened outside any primitive, e.g. a user call).
    `refusals` counts, the same way, the materialisations that the value refused
    (filled by [`quax.plugins.materialisations`][], which keeps tracing past them).
    """

    counts: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    refusals: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    # Whether a refusal is recorded (and tracing goes on with zeros in its place)
    # rather than raised.
    collect_refusals: bool = False

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return self.total > 0 or bool(self.refusals)

    def __str__(self) -> str:
        if not self.counts and not self.refusals:
            return "no value was materialised"
        lines = []
        if self.counts:
            lines.append("materialised values (primitive, type: count):")
            for (prim, typ), n in self.counts.most_common():
                lines.append(f"  {prim}, {typ}: {n}")
        if self.refusals:
            lines.append("refused to materialise (primitive, type: count):")
            for (prim, typ), n in self.refusals.most_common():
                lines.append(f"  {prim}, {typ}: {n}")
        return "\n".join(lines)


class _State(threading.local):
    reports: list[MaterialisationReport]
    primitive: str
    # Materialisations (and refusals) so far in this thread, tracked or not.
    count: int

    def __init__(self) -> None:
        self.reports = []
        self.primitive = "<outside>"
        self.count = 0


_state = _State()


@contextlib.contextmanager
def current_primitive(primitive: Primitive) -> Iterator[None]:
    """Name `primitive` as the one being dispatched, for materialisation reports."""
    previous = _state.primitive
    _state.primitive = primitive.name
    try:
        yield
    finally:
        _state.primitive = previous


def tracking() -> bool:
    return bool(_state.reports)


def _tracked(materialise: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @ft.wraps(materialise)
    def wrapper(self: Any) -> Any:
        _state.count += 1
        if not _state.reports:
            return materialise(self)
        key = (_state.primitive, type(self).__qualname__)
        try:
            out = materialise(self)
        except Exception:
            collecting = [r for r in _state.reports if r.collect_refusals]
            if not collecting:
                raise
            for report in collecting:
                report.refusals[key] += 1
            # Tracing goes on, to find the next refusal, with zeros in its place.
            aval = self.aval()
            return jax.numpy.zeros(aval.shape, aval.dtype)
        for report in _state.reports:
            report.counts[key] += 1
        return out

    return wrapper


@contextlib.contextmanager
def track_materialisation(
    collect_refusals: bool = False,
) -> Iterator[MaterialisationReport]:
    """Record every [`quax.Value`][] materialised inside the block.

    ```python
    with quax.track_materialisation() as report:
        jax.jit(quax.quaxify(f)).lower(x)
    print(report)  # which primitive densified which type, and how often
    ```

    Materialisation happens at trace time, so trace the function inside the block
    (call it, or `.lower` it) rather than reusing an already compiled one.

    **Arguments:**

    - `collect_refusals`: record each refusal to materialise in the report's
        `refusals` and go on tracing with zeros in its place, rather than raising
        (for reports only: the traced program is not the user's).

    **Returns:**

    A [`quax.MaterialisationReport`][], filled in as the block runs.
    """
    report = MaterialisationReport(collect_refusals=collect_refusals)
    _state.reports.append(report)
    try:
        yield report
    finally:
        _state.reports.remove(report)
