"""The rule registry: `quax.register`, the dispatch cache, and rule resolution."""

import abc
import dataclasses
import functools as ft
import importlib.metadata
import typing
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import jax
import plum

from ._compat import Primitive
from ._values import Value, is_value


__all__ = [
    "Resolution",
    "RuleConflictWarning",
    "register",
    "fallback_rule",
    "register_elementwise",
    "resolve",
    "rule_for",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# A resolved rule takes the primitive's inputs as a sequence and its params as a
# dict, whatever the rule's own calling convention was.
Rule = Callable[[Sequence[Any], dict[str, Any]], Any]


class RuleConflictWarning(UserWarning):
    """Two registrations of the same signature for the same primitive."""


@dataclasses.dataclass(frozen=True)
class _Registration:
    function: Callable[..., Any]
    signature: plum.Signature
    precedence: int


# One plum function per primitive, plus what was registered on it.
_functions: dict[Primitive, plum.Function] = {}
_registrations: dict[Primitive, list[_Registration]] = {}
# Whether every signature registered for a primitive is faithful, i.e. decided by
# the input types alone; only then may a resolution be cached by types.
_faithful: dict[Primitive, bool] = {}
# The dispatch cache: (primitive, input types) -> rule. Cleared by `register`.
_cache: dict[tuple[Primitive, tuple[type, ...]], Rule] = {}


def register(primitive: Primitive, *, precedence: int = 0) -> Callable[[_F], _F]:
    """Register a rule for `primitive`.

    ```python
    @quax.register(jax.lax.mul_p)
    def _(x: MyArray, y: ArrayLike) -> MyArray:
        ...
    ```

    Positional parameters are dispatched on by their annotations (subclasses of
    [`quax.Value`][], or `jaxtyping.ArrayLike` and friends for plain arrays); keyword
    parameters receive the primitive's params.

    **Arguments:**

    - `primitive`: the `jax.extend.core.Primitive` the rule is for.
    - `precedence`: breaks ties between otherwise ambiguous rules; the higher wins.

    **Returns:**

    A decorator that registers the rule and returns it unchanged. The rule returns
    the primitive's output: a `Value` or array, or a sequence of them for
    primitives with `multiple_results`.
    """

    def _register(rule: _F) -> _F:
        new = _Registration(rule, plum.Signature.from_callable(rule), precedence)
        registrations = _registrations.setdefault(primitive, [])
        for i, old in enumerate(registrations):
            # Equal signatures (precedence aside) never both reach plum: the higher
            # precedence wins, and on a tie the later registration.
            if old.signature == new.signature and old.function is not rule:
                _report_conflict(primitive, old, rule, precedence)
                if precedence >= old.precedence:
                    registrations[i] = new
                break
        else:
            registrations.append(new)
        function = plum.Function(_named(primitive), warn_redefinition=False)
        for registration in registrations:
            function.register(registration.function, precedence=registration.precedence)
        _functions[primitive] = function
        _faithful[primitive] = all(
            _decided_by_types(r.signature) for r in registrations
        )
        _cache.clear()
        return rule

    return _register


def register_elementwise(
    primitives: Iterable[Primitive], *, precedence: int = 0
) -> Callable[[_F], _F]:
    """Register one rule for a whole set of primitives, like JAX's `defvectorized`.

    The rule receives the primitive as its first positional argument:

    ```python
    @quax.register_elementwise([lax.sin_p, lax.cos_p, lax.exp_p])
    def _(primitive, x: MyArray, **params) -> MyArray:
        return MyArray(primitive.bind(x.array, **params))
    ```

    **Arguments:**

    - `primitives`: the primitives the rule applies to.
    - `precedence`: as for [`quax.register`][].

    **Returns:**

    A decorator that registers the rule for every primitive and returns it unchanged.
    """

    def _register(rule: _F) -> _F:
        for primitive in primitives:
            bound = ft.wraps(rule)(ft.partial(rule, primitive))
            # `ft.partial` hides the first parameter from plum's signature reader.
            bound.__signature__ = _drop_first_parameter(rule)  # type: ignore[attr-defined]
            register(primitive, precedence=precedence)(bound)
        return rule

    return _register


def _decided_by_types(signature: plum.Signature) -> bool:
    """Whether the input types alone decide whether `signature` matches, so that a
    resolution may be cached by types. Plum counts `jax.Array` (and so `ArrayLike`)
    as unfaithful because of its instance check; for quax's inputs (arrays, tracers,
    scalars) the type decides, so it is counted as faithful here."""
    hints = [*signature.types]
    if signature.has_varargs:
        hints.append(signature.varargs)
    for hint in hints:
        for member in typing.get_args(hint) or (hint,):
            if member is jax.Array or member is Any or member is object:
                continue
            if not isinstance(member, type) or type(member) not in (
                type,
                abc.ABCMeta,
                type(Value),
            ):
                return False
    return True


def _drop_first_parameter(rule: Callable[..., Any]) -> Any:
    import inspect

    signature = inspect.signature(rule)
    parameters = list(signature.parameters.values())[1:]
    return signature.replace(parameters=parameters)


def _named(primitive: Primitive) -> Callable[..., Any]:
    def rule(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    rule.__name__ = rule.__qualname__ = f"quax_rule_{primitive.name}"
    return rule


def _distribution_of(function: Callable[..., Any]) -> str:
    """The installed distribution that defines `function`, for reports."""
    package = (getattr(function, "__module__", None) or "?").split(".")[0]
    distributions = importlib.metadata.packages_distributions().get(package)
    if distributions:
        return f"{distributions[0]} ({function.__module__}.{function.__qualname__})"
    return f"{function.__module__}.{function.__qualname__}"


def _report_conflict(
    primitive: Primitive, old: _Registration, new: Callable[..., Any], precedence: int
) -> None:
    old_name, new_name = _distribution_of(old.function), _distribution_of(new)
    if precedence == old.precedence:
        outcome = (
            f"both have precedence {precedence}, so the later one, {new_name}, wins; "
            "give one of them a different `precedence=` to choose explicitly"
        )
    else:
        winner = new_name if precedence > old.precedence else old_name
        outcome = f"{winner} wins by its higher precedence"
    warnings.warn(
        f"Two quax rules for primitive `{primitive.name}` have the same signature: "
        f"{old_name} (precedence {old.precedence}) and {new_name} (precedence "
        f"{precedence}); {outcome}.",
        RuleConflictWarning,
        stacklevel=3,
    )


# Resolution ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Resolution:
    """How a primitive applied to some input types is computed, and why.

    `kind` is `"rule"` (a registered rule), `"default"` (a type's `default`), or
    `"materialise"` (no rule: every `Value` is densified and the primitive bound).
    """

    kind: str
    function: Callable[..., Any] | None
    reason: str


def _overrides_default(cls: type) -> bool:
    return cls.default is not Value.default


def resolve(primitive: Primitive, values: Sequence[Any]) -> Resolution:
    """Find how `primitive` applies to `values`, and why (no caching).

    **Arguments:**

    - `primitive`: the primitive being bound.
    - `values`: its inputs, or their types (`jax.Array` for a plain array).

    **Returns:**

    A [`quax.Resolution`][] naming the rule and the reason it was chosen.
    """
    function = _functions.get(primitive)
    by_type = all(isinstance(v, type) for v in values)
    if function is not None:
        try:
            target = plum.Signature(*values) if by_type else tuple(values)
            method, _ = function.resolve_method(target)
        except plum.NotFoundLookupError:
            pass
        except plum.AmbiguousLookupError as e:
            names = ", ".join(_type_name(v) for v in values)
            raise TypeError(
                f"Ambiguous quax rules for primitive `{primitive.name}` on input types "
                f"({names}): {e}. Register a more specific rule, or pass "
                "`precedence=` to `quax.register` to choose one."
            ) from None
        else:
            return Resolution(
                "rule",
                method,
                f"registered rule {method.__module__}.{method.__qualname__}",
            )
    return _resolve_fallback(primitive, values)


def _type_name(v: Any) -> str:
    return (v if isinstance(v, type) else type(v)).__qualname__


def _resolve_fallback(primitive: Primitive, values: Sequence[Any]) -> Resolution:
    types = [v if isinstance(v, type) else type(v) for v in values]
    overriding = list(
        dict.fromkeys(
            t for t in types if issubclass(t, Value) and _overrides_default(t)
        )
    )
    # quax's own stand-in for a plain array (a loop carry's constant start while
    # its type is found) turns itself into the other inputs' type first.
    overriding = [t for t in overriding if getattr(t, "settles_first", False)] or (
        overriding
    )
    if len(overriding) > 1:
        names = " and ".join(f"`{t.__module__}.{t.__qualname__}`" for t in overriding)
        raise TypeError(
            f"No quax rule for primitive `{primitive.name}` on input types "
            f"({', '.join(map(_type_name, values))}), and both {names} "
            "override `Value.default`, so quax cannot choose a fallback. Register a "
            "rule "
            f"for `{primitive.name}` on these types with `quax.register`."
        )
    if overriding:
        cls = overriding[0]
        return Resolution(
            "default", cls.default, f"`{cls.__qualname__}.default` (no matching rule)"
        )
    return Resolution(
        "materialise", None, "no rule and no `default` override: materialise and bind"
    )


def _materialise_and_bind(primitive: Primitive) -> Rule:
    def rule(values: Sequence[Any], params: dict[str, Any]) -> Any:
        dense = [type(v).materialise(v) if is_value(v) else v for v in values]
        return primitive.bind(*dense, **params)

    return rule


def _as_rule(primitive: Primitive, resolution: Resolution) -> Rule:
    function = resolution.function
    if resolution.kind == "rule":
        assert function is not None
        return lambda values, params: function(*values, **params)
    if resolution.kind == "default":
        assert function is not None
        return ft.partial(function, primitive)
    return _materialise_and_bind(primitive)


def fallback_rule(primitive: Primitive, values: Sequence[Any]) -> Rule:
    """The rule used when no registered rule applies to `values`: the `default` of
    the one type overriding it, else materialise and bind. A registered rule that
    handles only some cases calls this for the others."""
    return _as_rule(primitive, _resolve_fallback(primitive, values))


def rule_for(primitive: Primitive, values: Sequence[Any]) -> Rule:
    """The rule for `primitive` on `values`, through the dispatch cache."""
    key = (primitive, tuple(map(type, values)))
    try:
        return _cache[key]
    except KeyError:
        pass
    rule = _as_rule(primitive, resolve(primitive, values))
    if _faithful.get(primitive, True):
        _cache[key] = rule
    return rule
