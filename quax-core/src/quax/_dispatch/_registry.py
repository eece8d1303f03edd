"""The rule registry: `quax.register`, the dispatch cache, and rule resolution."""

import abc
import contextlib
import dataclasses
import functools as ft
import inspect
import threading
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
import plum

from .._compat import Primitive
from .._foundation import _caches, _journal
from .._foundation._owners import (
    RuleConflictWarning,
    describe_rule,
    owner,
    report_conflict,
)
from .._values._value import Value, describe_types, is_value


__all__ = [
    "Resolution",
    "RuleConflictWarning",
    "register",
    "fallback_rule",
    "register_elementwise",
    "registered_rule",
    "resolve",
    "rule_for",
    "rules_generation",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# A resolved rule takes the primitive's inputs as a sequence and its params as a
# dict, whatever the rule's own calling convention was.
Rule = Callable[[Sequence[Any], dict[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class _Registration:
    function: Callable[..., Any]
    signature: plum.Signature
    precedence: int
    # A rule annotating none of its positional parameters: it matches any types,
    # and is consulted only where no annotated rule matches.
    catch_all: bool


# One plum function per primitive, plus what was registered on it; the catch-all
# rules of a primitive form a second plum function, consulted after the first.
_functions: dict[Primitive, plum.Function] = {}
_catch_alls: dict[Primitive, plum.Function] = {}
_registrations: dict[Primitive, list[_Registration]] = {}
# Whether every signature registered for a primitive is faithful, i.e. decided by
# the input types alone; only then may a resolution be cached by types.
_faithful: dict[Primitive, bool] = {}
# The dispatch cache: (primitive, input types) -> rule. Cleared by `register`.
_cache: dict[tuple[Primitive, tuple[type, ...]], Rule] = {}
# How many rules were registered so far (see `rules_generation`).
_generation = 0
# The same count, in a setting JAX's caches key on (its trace context): a `jax.jit`
# traced before a rule was registered (or taken back) is traced again after it,
# rather than running the program the old rules gave. Left unchanged while the
# installed families load automatically (see `quax._dispatch._plugins.autoload`):
# that runs on the process's first quaxified call, before any rule was dispatched,
# so no program can depend on the rules it adds; and when that first call is inside
# a `jax.jit`, a changed key would trace and compile that `jit` again on its next
# call.
_jit_generation = jax.make_user_context(default_value=0)
_jit_generation_kept = False
# Held while dispatch for a primitive is rebuilt, and while a resolution is stored
# in the dispatch cache: a resolution started before a `register` is never stored
# after it (it may name a rule that no longer wins).
_lock = threading.RLock()
# The params each rule takes by name, read once at registration; `None` for a rule
# with `**params`, which receives every param.
_keywords: dict[Callable[..., Any], frozenset[str] | None] = {}


def register(primitive: Primitive, *, precedence: int = 0) -> Callable[[_F], _F]:
    """Register a rule for `primitive`.

    ```python
    @quax.register(jax.lax.mul_p)
    def _(x: MyArray, y: ArrayLike, **params) -> MyArray:
        return MyArray(jax.lax.mul_p.bind(x.array, y, **params))
    ```

    Positional parameters are dispatched on by their annotations (subclasses of
    [`quax.Value`][], or `jaxtyping.ArrayLike` and friends for plain arrays); keyword
    parameters receive the primitive's params. Take them all with `**params`: every
    JAX release adds params to some primitives (`out_sharding`, `out_dtype`,
    `accuracy`, `top_k`'s `axis`, ...). A rule written without `**params` is still
    called, without the params it does not declare, as long as each of them holds
    its neutral value (`None`, or `-1` for `top_k`'s `axis`): the value that means
    what the primitive did before the param existed. Otherwise the call raises a
    `TypeError` naming the rule and the param.

    A rule that annotates none of its positional parameters (`def _(x, y,
    **params)`) matches any input types: it ranks below every annotated rule for
    the primitive and is used only where none of them matches (before a type's
    `default`). When it catches a value type of another distribution than its own,
    each dispatch there warns with a [`quax.RuleConflictWarning`][] naming the
    rule: annotate the types it handles.

    Registering the same signature again from the same distribution (or running the
    same module again) replaces the earlier rule, as `plum` does. Two different
    distributions registering the same signature is reported with a
    [`quax.RuleConflictWarning`][]; the higher `precedence` wins, and on a tie the
    later registration.

    A rule must not rely on how many times it runs, as a function that JAX traces
    may be traced any number of times: for one primitive call it may run once,
    twice (eagerly, on a key's second call, to trace its compiled program and, if
    that program is dropped, again equation by equation; see
    [`quax.set_eager_compilation`][]), or not at all (the compiled program
    replays its output; while a program is staged, the equations a rule staged
    for the same primitive, params, value types, static fields, avals and JAX
    settings are replayed, as are a library `jit`'s). Keep side effects out of
    rules; a rule that reads the numbers of a leaf does so through
    [`quax.known_constant`][].

    **Arguments:**

    - `primitive`: the `jax.extend.core.Primitive` the rule is for, such as
        `jax.lax.mul_p` (not the function `jax.lax.mul` or `jnp.multiply`).
    - `precedence`: breaks ties between otherwise ambiguous rules; the higher wins.

    **Returns:**

    A decorator that registers the rule and returns it unchanged. The rule returns
    the primitive's output: a `Value` or array, or a sequence of them for
    primitives with `multiple_results`.
    """
    _check_primitive(primitive, "quax.register")

    def _register(rule: _F) -> _F:
        signature = _checked_signature(primitive, rule)
        new = _Registration(rule, signature, precedence, _is_catch_all(rule))
        with _lock:  # one registration at a time
            registrations = _registrations.setdefault(primitive, [])
            before = list(registrations)
            for i, old in enumerate(registrations):
                if old.signature != new.signature:
                    continue
                # Equal signatures (precedence aside) never both reach plum. The same
                # owner registering again redefines the rule; between two owners the
                # higher precedence wins, and on a tie the later registration.
                if owner(old.function) == owner(rule):
                    registrations[i] = new
                else:
                    report_conflict(
                        primitive, old.function, old.precedence, rule, precedence
                    )
                    if precedence >= old.precedence:
                        registrations[i] = new
                break
            else:
                registrations.append(new)
            _keywords[rule] = _declared_keywords(rule)
            _rebuild(primitive)
            if any(r is new for r in registrations):
                kept = set(map(id, registrations))
                replaced = next((o for o in before if id(o) not in kept), None)
                take_back = ft.partial(_withdraw, primitive, new, replaced)
                _journal.record(take_back, getattr(rule, "__module__", None))
        return rule

    return _register


def _rebuild(primitive: Primitive) -> None:
    """Dispatch for `primitive` from its registrations: its plum functions, whether
    its signatures are faithful; and every resolution made before forgotten."""
    global _generation
    registrations = _registrations.get(primitive, [])
    built = {}
    for catch_all in (False, True):
        function = plum.Function(_named(primitive), warn_redefinition=False)
        for registration in registrations:
            if registration.catch_all is catch_all:
                function.register(
                    registration.function, precedence=registration.precedence
                )
        built[catch_all] = function
    with _lock:
        _functions[primitive] = built[False]
        _catch_alls[primitive] = built[True]
        _faithful[primitive] = all(
            _decided_by_types(r.signature) for r in registrations
        )
        _generation += 1
        if not _jit_generation_kept:
            _jit_generation.set_global(_generation)
        _caches.invalidate()  # clears `_cache` too


def _withdraw(
    primitive: Primitive, new: _Registration, replaced: _Registration | None
) -> None:
    """Take back the registration `new` (see `quax._foundation._journal`): the rule it
    replaced comes back, if any."""
    with _lock:
        registrations = _registrations.get(primitive, [])
        for i, registration in enumerate(registrations):
            if registration is new:
                if replaced is None:
                    del registrations[i]
                else:
                    registrations[i] = replaced
                _rebuild(primitive)
                return


@contextlib.contextmanager
def jit_generation_kept() -> Iterator[None]:
    """Inside the block, registering a rule leaves JAX's cache keys as they are (see
    `_jit_generation`): for the automatic loading of the installed families only,
    which happens before any rule is dispatched."""
    global _jit_generation_kept
    with _lock:
        kept, _jit_generation_kept = _jit_generation_kept, True
    try:
        yield
    finally:
        with _lock:
            _jit_generation_kept = kept


def rules_generation() -> int:
    """How many rules have been registered so far, in any family.

    Whatever a caller derives from dispatch and keeps (a compiled program, a cache of
    resolutions) is valid while this number is unchanged: registering a rule may
    change what later dispatch answers.

    **Returns:**

    An `int` that grows by one with each rule registered, and with each
    registration taken back (a family that failed half-way, see `quax.plugins`).
    """
    return _generation


def _check_primitive(primitive: Any, where: str) -> None:
    if isinstance(primitive, Primitive):
        return
    raise TypeError(
        f"{where} expects a JAX primitive, such as `jax.lax.add_p` or "
        f"`jax.lax.dot_general_p`; got {primitive!r} (of type "
        f"`{type(primitive).__qualname__}`). Functions such as `jnp.add` or "
        "`jax.lax.add` bind primitives; register the primitive itself (find it "
        "with `jax.make_jaxpr(f)(x)`, which names each primitive a function binds)."
    )


def _checked_signature(primitive: Primitive, rule: Any) -> plum.Signature:
    """The rule's dispatch signature, refusing a rule that could not dispatch."""
    if not callable(rule):
        raise TypeError(
            f"quax.register({primitive.name}_p) decorates a function; got {rule!r}."
        )
    return plum.Signature.from_callable(rule)


def _is_catch_all(rule: Callable[..., Any]) -> bool:
    """Whether `rule` annotates none of its positional parameters, so that it
    matches any input types. A rule without positional parameters matches only a
    call with no operands (as with plum): it never catches a call on a value."""
    positional = [
        p
        for p in inspect.signature(rule).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return bool(positional) and all(p.annotation is p.empty for p in positional)


def _declared_keywords(rule: Callable[..., Any]) -> frozenset[str] | None:
    parameters = inspect.signature(rule).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(
        p.name
        for p in parameters
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


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

    if isinstance(primitives, Primitive):
        raise TypeError(
            "quax.register_elementwise expects a collection of primitives, such as "
            f"`[jax.lax.sin_p, jax.lax.cos_p]`; got the single primitive "
            f"`{primitives.name}`: use `quax.register` for one primitive."
        )
    primitives = list(primitives)
    for primitive in primitives:
        _check_primitive(primitive, "quax.register_elementwise")

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

    ```python
    quax.resolve(jax.lax.dot_general_p, [LoraArray, jax.Array])
    ```

    **Arguments:**

    - `primitive`: the primitive being bound, such as `jax.lax.mul_p`.
    - `values`: its inputs, or their types: subclasses of [`quax.Value`][], and
        `jax.Array` (or a NumPy or Python scalar type) for a plain array.

    **Returns:**

    A [`quax.Resolution`][] naming the rule and the reason it was chosen.
    """
    _check_primitive(primitive, "quax.resolve")
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise TypeError(
            "quax.resolve expects a sequence of input types or values, such as "
            f"`[MyArray, jax.Array]`; got {values!r}."
        )
    values = list(values)
    for v in values:
        if not _is_input(v):
            raise TypeError(
                f"quax.resolve expects input types (subclasses of `quax.Value`, or "
                f"`jax.Array` for a plain array) or input values; got {v!r}, which "
                f"is neither."
            )
    if any(isinstance(v, type) for v in values):
        values = [v if isinstance(v, type) else type(v) for v in values]
    return _resolve(primitive, values)


_INPUT_TYPES = (Value, jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def _is_input(v: Any) -> bool:
    if isinstance(v, type):
        return issubclass(v, _INPUT_TYPES)
    return isinstance(v, _INPUT_TYPES)


def _resolve(primitive: Primitive, values: Sequence[Any]) -> Resolution:
    by_type = all(isinstance(v, type) for v in values)
    target = plum.Signature(*values) if by_type else tuple(values)
    for functions, kind in ((_functions, ""), (_catch_alls, ", without annotations")):
        function = functions.get(primitive)
        if function is None:
            continue
        try:
            method, _ = function.resolve_method(target)
        except plum.NotFoundLookupError:
            continue
        except plum.AmbiguousLookupError as e:
            names = describe_types(values)
            raise TypeError(
                f"Ambiguous quax rules for primitive `{primitive.name}` on input types "
                f"({names}): {e}. Register a more specific rule, or pass "
                "`precedence=` to `quax.register` to choose one."
            ) from None
        return Resolution(
            "rule", method, f"registered rule {describe_rule(method)}{kind}"
        )
    return _resolve_fallback(primitive, values)


def _warn_if_foreign(
    primitive: Primitive, resolution: Resolution, values: Sequence[Any]
) -> None:
    """Warn when a rule without annotations caught a value type of another
    distribution than the rule's own: it would otherwise silently take over other
    people's types."""
    function = resolution.function
    if resolution.kind != "rule" or function is None or not _is_catch_all(function):
        return
    rule_owner = owner(function)
    types = dict.fromkeys(map(type, values))
    foreign = [t for t in types if issubclass(t, Value) and owner(t) != rule_owner]
    if not foreign:
        return
    names = ", ".join(f"`{t.__module__}.{t.__qualname__}`" for t in foreign)
    warnings.warn(
        f"The quax rule {describe_rule(function)} for primitive `{primitive.name}` "
        f"annotates none of its positional parameters, and it catches {names}, "
        f"of another distribution than the rule's ({rule_owner}), which has no rule "
        f"of its own for `{primitive.name}` here. Annotate the inputs the rule "
        "handles, e.g. `def _(x: MyArray, y: ArrayLike, **params)`.",
        RuleConflictWarning,
        stacklevel=2,
    )


def _resolve_fallback(primitive: Primitive, values: Sequence[Any]) -> Resolution:
    types = [v if isinstance(v, type) else type(v) for v in values]
    # One type per `default` function: types sharing one (every family following
    # `quax.GuardedValue`'s policy) do not compete, their shared `default` decides.
    by_default: dict[Any, type] = {}
    for t in types:
        if issubclass(t, Value) and _overrides_default(t):
            by_default.setdefault(t.default, t)
    overriding = list(by_default.values())
    # quax's own stand-in for a plain array (a loop carry's constant start while
    # its type is found) turns itself into the other inputs' type first.
    overriding = [t for t in overriding if getattr(t, "settles_first", False)] or (
        overriding
    )
    if len(overriding) > 1:
        names = " and ".join(f"`{t.__module__}.{t.__qualname__}`" for t in overriding)
        raise TypeError(
            f"No quax rule for primitive `{primitive.name}` on input types "
            f"({describe_types(values)}), and {names} override "
            "`Value.default` differently, so quax cannot choose a fallback. Register a "
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
        return _calling(primitive, function, _keywords.get(function))
    if resolution.kind == "default":
        assert function is not None
        return ft.partial(function, primitive)
    return _materialise_and_bind(primitive)


def _calling(
    primitive: Primitive, function: Callable[..., Any], keywords: frozenset[str] | None
) -> Rule:
    """How a registered rule is called: with every param, or (for a rule without
    `**params`) with those it declares, checking that the others are neutral."""
    if keywords is None:
        return lambda values, params: function(*values, **params)

    def rule(values: Sequence[Any], params: dict[str, Any]) -> Any:
        if params.keys() <= keywords:
            return function(*values, **params)
        declared = {}
        for name, value in params.items():
            if name in keywords:
                declared[name] = value
            elif not _is_neutral(primitive, name, value, values):
                raise _undeclared_param(primitive, function, name, value)
        return function(*values, **declared)

    return rule


def _last_axis(axis: Any, values: Sequence[Any]) -> bool:
    operand = values[0]
    ndim = len(operand.aval().shape) if is_value(operand) else np.ndim(operand)
    return axis in (-1, ndim - 1)


# Params whose neutral value (what the primitive did before the param existed) is
# not `None`, by (primitive name, param name): the value counts as neutral where
# the predicate holds.
_NEUTRAL: dict[tuple[str, str], tuple[str, Callable[[Any, Sequence[Any]], bool]]] = {
    ("top_k", "axis"): ("-1, the last axis", _last_axis),
}


def _is_neutral(
    primitive: Primitive, name: str, value: Any, values: Sequence[Any]
) -> bool:
    if value is None:
        return True
    neutral = _NEUTRAL.get((primitive.name, name))
    return neutral is not None and neutral[1](value, values)


def _undeclared_param(
    primitive: Primitive, function: Callable[..., Any], name: str, value: Any
) -> TypeError:
    neutral = _NEUTRAL.get((primitive.name, name), ("None",))[0]
    return TypeError(
        f"The quax rule {describe_rule(function)} for primitive `{primitive.name}` "
        f"does not take the param `{name}`, and JAX binds `{primitive.name}` with "
        f"`{name}={value!r}` here. A rule without `{name}` is only called while "
        f"it holds its neutral value ({neutral}); with another value the rule "
        f"would compute something else. Add `**params` to the rule's signature "
        f"and handle `{name}` (e.g. pass `**params` on to "
        f"`{primitive.name}_p.bind`)."
    )


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
    generation = _generation
    resolution = _resolve(primitive, values)
    _warn_if_foreign(primitive, resolution, values)
    rule = _as_rule(primitive, resolution)
    if not _caches.is_enabled() or not _faithful.get(primitive, True):
        return rule
    if _caches.verifying:
        # The dispatch cache stays empty (every primitive resolves here), and
        # each resolution is compared with the first one for its key. A resolution
        # started before a registration is neither compared nor kept, as the cache
        # below keeps none: it may resolve otherwise now.
        with _lock:
            if generation == _generation:
                _caches.verify_dispatch(key, resolution, generation)
        return rule
    with _lock:
        # Not when a rule was registered meanwhile: it may resolve otherwise now.
        if generation == _generation:
            if len(_cache) >= MAX_DISPATCH:
                _cache.clear()
            _cache[key] = rule
    return rule


def registered_rule(
    primitive: Primitive, values: Sequence[Any], takes: Iterable[str] = ()
) -> Rule | None:
    """The registered rule for `primitive` on `values`, or `None` where none
    matches (no type's `default`, no materialising) or where the one that matches
    does not take a keyword argument of each name in `takes` (in its signature, or
    through `**params`): for keys whose caller has its own way when no rule
    applies (a jitted function's body, see `quax.register_function`). Not cached:
    it is asked once per trace."""
    resolution = _resolve(primitive, values)
    if resolution.kind != "rule":
        return None
    assert resolution.function is not None
    keywords = _keywords.get(resolution.function)
    if keywords is not None and not keywords.issuperset(takes):
        return None
    _warn_if_foreign(primitive, resolution, values)
    return _as_rule(primitive, resolution)


# The dispatch cache's bound: past it, it starts afresh.
MAX_DISPATCH = 4096
_caches.on_invalidate(_cache.clear)
_caches.measured("dispatch cache", lambda: (len(_cache), str(MAX_DISPATCH)))
