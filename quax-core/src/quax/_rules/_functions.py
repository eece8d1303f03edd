"""Rules for jitted library functions (`quax.register_function`), and the `jit` rule
that runs them.

A function registered with `quax.register_function` (a `jax.jit`-decorated library
function, such as `jnp.hypot`) gets a synthetic `Primitive` of its own in the
registry, so that its rules dispatch on types, conflict and show in `python -m quax`
as primitive rules do. The `jit` rule recognises the function's `jit` by the source
JAX records for it, and then by its body (the function traced on the body's argument
types must give the same program); it resolves the function's primitive on the
arguments' types and runs the rule, or runs the body under the rules (a nested `jit`
body, `_control_flow.py`) where no rule matches or the body is a transformation of
the function's. A rule registered with a `jvp` is differentiated by it (see
`quax._foundation._jit_rules`, which replaces JAX's `jvp` and `linearize` rules of
`jit` for it).
"""

import functools as ft
import inspect
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import eq
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._caching._per_jaxpr import per_jaxpr
from .._compat import (
    Primitive,
    Tracer,
    jit_may_inline,
    jit_p,
    jvp_body,
    primal_behind,
    traced_jit,
)
from .._dispatch._known import ValueAsked
from .._dispatch._registry import register, registered_rule, resolve
from .._foundation._caches import ADDRESS, Table
from .._foundation._jit_rules import differentiate_jits_with, keep_inline_jit
from .._transform import _trace
from .._transform._interpreter import body_source
from .._transform._trace import QuaxTracer
from .._values._value import ValueLike, describe_types, is_value
from ._control_flow import _jit_body


__all__ = ["register_function"]

_F = TypeVar("_F", bound=Callable[..., Any])


# jit ----------------------------------------------------------------------------------

# The functions rules are registered for (`register_function`), by the source of
# the function as JAX records it in the debug info of its `jit` ("hypot at
# .../ufuncs.py:3713"). Several functions may share one source (two lambdas on one
# line, the statements of a REPL or the strings given to `exec`, which all start
# at line 1): a body met under a source is the registered function's only where
# that function, traced on the body's argument types, gives the same body (see
# `_identify`).
_registered: dict[str, list["_Registered"]] = {}


class _Registered:
    """A function rules are registered for: its code, its `jit`, its synthetic
    primitive (the rules' key in the registry), the names of its parameters that
    take positional arguments (those before any `*args`, and the name of `*args`
    or `None`), the values of its static arguments that some rule for it
    takes (`static` of `register_function`), by name, the rules whose
    function's body does not stand in for them (`body_stands_in=False`), and the
    `jvp` registered with each rule that has one."""

    def __init__(self, function: Callable[..., Any], name: str) -> None:
        self.code = inspect.unwrap(function).__code__
        # The `jit` itself (`function` may wrap it, as a `custom_jvp` does).
        self.jitted = inspect.unwrap(
            function, stop=lambda f: isinstance(f, jax.stages.Wrapped)
        )
        if not isinstance(self.jitted, jax.stages.Wrapped):
            raise TypeError(
                f"quax.register_function expects a function decorated with "
                f"`jax.jit` (such as `jnp.hypot`), got {function!r}, which wraps "
                f"no `jax.jit`."
            )
        self.primitive = Primitive(f"{name} (jitted function)")
        self.parameters = _positional_parameters(function)
        self.static: dict[str, list[Any]] = {}
        # The rules registered with `body_stands_in=False`.
        self.not_stand_ins: set[Callable[..., Any]] = set()
        # The `jvp` of each rule registered with one, by rule.
        self.jvps: dict[Callable[..., Any], Callable[..., Any]] = {}


def register_function(
    function: Callable[..., Any],
    *,
    precedence: int = 0,
    static: Mapping[str, Iterable[Any]] | None = None,
    body_stands_in: bool = True,
    jvp: Callable[..., Any] | None = None,
) -> Callable[[_F], _F]:
    """Register a rule for a jitted library function (`jnp.hypot`), used in place
    of the function's body where quax meets its `jit` with arguments whose types
    the rule's annotations match.

    ```python
    @quax.register_function(jnp.hypot)
    def _(x: MyArray, y: MyArray | ArrayLike, *, call):
        return MyArray(jnp.hypot(x.array, dense(y)))
    ```

    A primitive rule sees the function's body one primitive at a time. Some
    bodies are written for plain arrays in a way no primitive rule can follow:
    `jnp.hypot` divides by `where(x == 0, 1, x)`, a plain 1 that a quantity's
    units cannot take; `jnp.isclose` adds a plain default `atol`. A family
    computes such a function whole on its values instead, or explains its error.
    The function is recognised by the source file and line JAX records for the
    `jit` (not by its name, which any function may share), and by its body: the
    rule runs where the function itself, traced on the same argument types with
    its other parameters at their defaults, gives the body quax meets. So another
    function JAX records at the same source (two lambdas on one line; a REPL's
    statements and the strings run by `exec` all start at line 1; a module edited
    and reloaded) does not get the rule, and neither does a call whose static
    arguments (`jax.jit`'s `static_argnames`, such as an `axis` or a flag) change
    what the function computes: the body runs there instead, unless the rule takes
    those arguments (`static`). A closure is refused (a `TypeError`): every
    function its enclosing function makes has its source.

    Rules are dispatched on their positional parameters' annotations as
    [`quax.register`][]'s are (each registered function has its own key in the
    registry, a primitive named after it): several families may register rules for
    one function, the most specific wins, and two distributions registering the
    same signature are reported with a [`quax.RuleConflictWarning`][]. Where no
    rule matches the arguments' types (or none of them is a value), the function's
    body runs under the rules, as without a rule. So it does where `vmap`, `grad`
    or `linearize` runs inside `quaxify`: quax then meets a transformation of the
    body (batched along axes the rule cannot know, or its derivative's parts), not
    the function, unless that transformation is the function's own program on its
    arguments' types (`vmap` of an elementwise function: the rule then runs);
    apply those outside `quaxify` (`jax.vmap(quax.quaxify(f))`) for the rule to
    see the function's own arguments. Under `jvp` inside `quaxify` quax meets the
    `jvp` of the body, recognises it, and computes the `jvp` of the rule (with
    the function's static arguments at their defaults, and tangents of their
    primals' types; otherwise the body's `jvp` runs). The body that runs in those
    places must compute what the rule does (slower, perhaps: a structured matrix
    materialised), or the result is wrong; a rule that computes what the body
    cannot (quax-units' `jnp.rad2deg` shows an angle in degrees, where the body
    multiplies the angle's number by 180 / pi) is registered with
    `body_stands_in=False`, and quax then raises there, at trace time, rather
    than run the body. A rule may come with its derivative instead (`jvp`): where
    `grad`, `jvp`, `linearize`, `vjp`, `jacfwd`, `jacrev` or `hessian` (or `vmap`
    around them) inside `quaxify` differentiates the function on values the rule
    matches, quax computes the outputs by the rule and their tangents by the
    `jvp`, before JAX changes the body, and JAX transposes what the `jvp`
    computes where `grad` needs it; the body's derivative runs nowhere. A
    derivative that JAX takes while it traces a body on abstract arguments
    (`grad` inside a `jax.jit`, a `jax.jit` or `jax.checkpoint` inside `grad`)
    still changes the body before quax knows the types: there the body runs, or
    quax raises. A function that JAX inlines
    into its callers (`jax.jit(inline=True)`, as `jnp.rad2deg` is) is kept as a
    call (a `jit` equation) from its first registration on, wherever it is called:
    by quax, and by JAX's own staging, which inlines it otherwise. So its rules run
    in the quaxified function, in the functions it calls, and in the bodies JAX
    traces itself before quax meets them: a `jax.jit` or `eqx.filter_jit`
    function, a `lax.scan`, `lax.cond`, `lax.while_loop` or `lax.fori_loop` body,
    `jax.checkpoint`. Outside `quaxify` a kept call computes what its inlined
    equations compute, so plain JAX programs give the same results. Registering a
    rule forgets whatever quax kept from earlier calls of the function (compiled
    programs, recordings), as registering a primitive rule does, and JAX traces
    again a `jax.jit` it traced inside `quaxify` before (a jaxpr JAX traced with
    the function inlined never reaches the rules).

    **Arguments:**

    - `function`: the jitted function, as the user calls it (`jnp.hypot`).
    - `precedence`: breaks ties between otherwise ambiguous rules; the higher wins.
    - `static`: the static arguments the rule handles, by name, each with the
        values other than its default that the rule computes (`{"hermitian":
        (True,)}`). The rule takes each as a keyword parameter whose default is the
        function's (`hermitian=False`), and receives it where a call passes one of
        those values; quax finds the value by tracing the function with each of
        them until it gives the body it meets. With a static argument at any other
        value, the body runs.
    - `body_stands_in`: whether the function's body, run under the rules on the
        rule's argument types, computes what the rule does, so that it may run in
        the rule's place where a transformation inside `quaxify` (`grad`,
        `linearize`, `vjp`, `jacfwd`, `jacrev`, `hessian`, a `vmap` quax does not
        recognise, `jvp` with a plain tangent) changed it. `False` makes those
        places raise a `NotImplementedError` at trace time that names the
        function and the way out (the transformation outside `quaxify`, or a
        `jvp`).
    - `jvp`: the derivative of the rule, for `grad`, `jvp`, `linearize`, `vjp`,
        `jacfwd`, `jacrev` and `hessian` inside `quaxify`: a function
        `jvp(primals, tangents, **static)` of the rule's positional arguments
        (a tuple, as the rule gets them), their tangents (a tuple: zeros where an
        argument has none) and the static arguments the rule takes, returning
        the tangents of the function's outputs (one array, or a sequence as the
        function returns its outputs). It is JAX code, as a `jax.custom_jvp`
        rule is: it runs on the values as quaxified code does, their operations
        under the rules, and must be linear in the tangents, which may be plain
        arrays (`grad` seeds them so) or values (a `jvp` given values); under
        `grad` JAX stages and transposes it. quax-units' `jnp.rad2deg` shows the
        same angle in `deg`, whose SI numbers are the angle's: its tangent is
        the angle's, `lambda primals, tangents: tangents[0]`.

    **Returns:**

    A decorator that registers the rule and returns it unchanged. The rule takes
    the `jit`'s arguments and a keyword argument `call`, which runs the
    function's body on arguments under the rules, as quax does without the rule;
    it returns the function's output. The `jit`'s arguments are the function's
    array arguments that JAX passes in: those it declares static, Python numbers
    left at their defaults and values without leaves (a symbolic zero) are
    constants of the body instead, so a rule's signature matches only the calls
    that pass it what it needs, and any other call runs the body. The rule gets
    them positionally only where they are the function's leading parameters in
    order (then `*args`): where an argument passed by keyword skips a parameter
    (`jnp.isclose(a, b, atol=t)` passes `(a, b, t)`, which a rule would read as
    `(a, b, rtol)`), where a parameter before it is static or a constant of the
    body, or where an argument is a pytree of several arrays, the body runs.
    """
    source, name = _source_of(function)
    static = {k: list(v) for k, v in (static or {}).items()}
    parameters = inspect.signature(inspect.unwrap(function)).parameters
    for argument in static:
        if argument not in parameters:
            raise TypeError(
                f"quax.register_function: `{argument}` is not a parameter of "
                f"`{name}` (its parameters: {', '.join(parameters)}); `static` "
                f"names the function's static arguments that the rule takes."
            )
    candidates = _registered.setdefault(source, [])
    code = inspect.unwrap(function).__code__
    registered = next((r for r in candidates if r.code is code), None)
    if registered is None:
        registered = _Registered(function, name)
        candidates.append(registered)
        inline, jit_name = jit_may_inline(registered.jitted)
        if inline:
            # Its inlined `jit` stays a call wherever JAX stages it, and comes to
            # the `jit` rule (see `_jit`) wherever quax meets it, not inlined.
            keep_inline_jit(jit_name, source)
    registering = register(registered.primitive, precedence=precedence)

    def _register(rule: _F) -> _F:
        rule_parameters = inspect.signature(rule).parameters.values()
        takes = {
            p.name
            for p in rule_parameters
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        }
        any_keyword = any(p.kind is p.VAR_KEYWORD for p in rule_parameters)
        for argument in static:
            if argument not in takes and not any_keyword:
                raise TypeError(
                    f"quax.register_function: the rule for `{name}` declares the "
                    f"static argument `{argument}` (`static`) but does not take it "
                    f"as a keyword parameter: add `{argument}=<the default of "
                    f"`{name}`>` after `*` in its signature."
                )
        for argument, values in static.items():
            known = registered.static.setdefault(argument, [])
            known += [v for v in values if not any(_same(v, k) for k in known)]
        if not body_stands_in:
            registered.not_stand_ins.add(rule)
        if jvp is not None:
            registered.jvps[rule] = jvp
            if not _sources_with_jvps:
                differentiate_jits_with(_jvp_for)
            _sources_with_jvps.add(source)
        return registering(rule)

    return _register


def _same(a: Any, b: Any) -> bool:
    """Whether two values of a static argument are the same (as `jax.jit` keys
    them: by type and equality)."""
    return type(a) is type(b) and bool(a == b)


def _positional_parameters(
    function: Callable[..., Any],
) -> tuple[tuple[str, ...], str | None]:
    """The names of `function`'s parameters that take positional arguments before
    any `*args`, and the name of its `*args` (or `None`)."""
    parameters = inspect.signature(inspect.unwrap(function)).parameters.values()
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    names = tuple(p.name for p in parameters if p.kind in positional)
    rest = next(
        (p.name for p in parameters if p.kind is inspect.Parameter.VAR_POSITIONAL),
        None,
    )
    return names, rest


def _in_order(jaxpr: Any, registered: _Registered) -> bool:
    """Whether the arguments of `jaxpr` (a body of the registered function) are
    its leading positional parameters in order, as JAX names them."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    names = None if info is None else info.arg_names
    if names is None:
        return False
    positional, rest = registered.parameters
    return all(
        name == positional[i]
        if i < len(positional)
        else rest is not None and name == f"{rest}[{i - len(positional)}]"
        for i, name in enumerate(names)
    )


# Which registered function each body met under a registered source is, with the
# static arguments it was traced with off their defaults (or `None`: none of them).
_identified = Table("register_function: the functions of jit bodies", 256)


def _identify(
    jaxpr: Any, candidates: list[_Registered]
) -> tuple[_Registered, dict[str, Any]] | None:
    """The registered function whose body `jaxpr` is, among `candidates` (those
    of its source whose leading parameters its arguments are), with the values of
    its static arguments that some rule takes, where they are not the defaults:
    the last registered that, traced on the body's argument types with those
    arguments (first at their defaults, then at each combination of the values
    rules take), gives the same body. `None` where none does: another function at
    the same source, or a static argument at a value no rule takes. Kept per body
    while the caches are on."""
    search = ft.partial(_search, candidates=candidates)
    return per_jaxpr(_identified, jaxpr, search, eq, "the registered function found")


def _search(
    jaxpr: Any, candidates: list[_Registered]
) -> tuple[_Registered, dict[str, Any]] | None:
    """`_identify`, computed."""
    found = None
    for registered in reversed(candidates):
        names = list(registered.static)
        choices = [[_DEFAULT, *registered.static[n]] for n in names]
        for values in itertools.product(*choices):
            statics = {
                n: v for n, v in zip(names, values, strict=True) if v is not _DEFAULT
            }
            if _traces_to(registered, statics, jaxpr):
                found = registered, statics
                break
        if found is not None:
            break
    return found


_DEFAULT = object()  # a static argument left at its default


def _traces_to(registered: _Registered, statics: dict[str, Any], jaxpr: Any) -> bool:
    """Whether the registered function's `jit`, traced on the argument types of
    `jaxpr` (passed positionally, see `_in_order`) with the keyword arguments
    `statics`, gives the body `jaxpr`."""
    try:
        traced = traced_jit(registered.jitted, jaxpr.in_avals, statics)
    except Exception:  # not a call this function takes: not its body
        return False
    return _same_body(traced, jaxpr)


def _same_body(a: Any, b: Any) -> bool:
    """Whether the closed jaxprs `a` and `b` are the same program: the same text
    (object addresses aside, floating-point literals read in their dtype) and
    bitwise the same constants."""
    if a is b:
        return True
    if len(a.consts) != len(b.consts) or not all(
        map(_same_constant, a.consts, b.consts)
    ):
        return False
    return _program_text(a) == _program_text(b)


def _program_text(jaxpr: Any) -> str:
    """The text of the closed `jaxpr`, without object addresses, with each
    floating-point literal written as the number its dtype holds: JAX writes a weakly
    typed literal as the Python float it was given (`57.29577951308232:f32[]`),
    which `vmap` keeps, where the function traced again on the batched type writes
    the float32 number (`57.295780181884766:f32[]`); both are one program."""
    text = ADDRESS.sub("", str(jaxpr.jaxpr))
    return _FLOAT_LITERAL.sub(_in_its_dtype, text)


# A floating-point literal in a jaxpr's text (`57.29577951308232:f32[]`).
_FLOAT_LITERAL = re.compile(
    r"(?<![\w.])(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)):(f16|bf16|f32|f64)\[\]"
)
_FLOAT_DTYPES = {"f16": np.float16, "bf16": jnp.bfloat16, "f32": np.float32}


def _in_its_dtype(literal: re.Match[str]) -> str:
    number, dtype = literal.groups()
    held = np.asarray(float(number), _FLOAT_DTYPES.get(dtype, np.float64))
    return f"{float(held)!r}:{dtype}[]"


def _same_constant(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, Tracer) or isinstance(b, Tracer):
        return False
    try:
        a, b = np.asarray(a), np.asarray(b)
    except Exception:  # an extended dtype (a PRNG key): only by identity
        return False
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _source_of(function: Callable[..., Any]) -> tuple[str, str]:
    """How JAX records `function`'s source in the debug info of its `jit`, and its
    name."""
    wrapped = inspect.unwrap(function)
    code = getattr(wrapped, "__code__", None)
    if code is None:
        raise TypeError(
            f"quax.register_function expects a Python function decorated with "
            f"`jax.jit` (such as `jnp.hypot`), got {function!r}."
        )
    name = wrapped.__name__
    if code.co_freevars:
        # Every function its enclosing function makes has this source: the rule
        # would run in place of each of them, whatever values they close over.
        raise TypeError(
            f"quax.register_function cannot recognise `{name}`: it is a closure "
            f"(over {', '.join(code.co_freevars)}), and every function its "
            f"enclosing function makes has its source, by which quax recognises "
            f"it, whatever values they close over. Register a function defined "
            f"at the top level of a module, taking those values as arguments."
        )
    return f"{name} at {code.co_filename}:{code.co_firstlineno}", name


@register(jit_p)
def _jit(*args: ValueLike, jaxpr: Any, **params: Any) -> list[Any]:
    source = (body_source(jaxpr) or "") if _registered else ""
    rule = None
    statics: dict[str, Any] = {}
    if source in _registered and any(is_value(a) for a in args):
        # Where the arguments are not the leading parameters in order, the body runs
        # (see `register_function`). A body that `vmap`, `grad`, ... transformed
        # inside `quaxify` is the function's only where the function, traced on its
        # arguments' types, gives that very program (`vmap` of an elementwise
        # function along one axis of each argument): the rule computes the function
        # on those arguments, which is what the program computes.
        candidates = [r for r in _registered[source] if _in_order(jaxpr, r)]
        found = _identify(jaxpr, candidates) if candidates else None
        if not candidates:
            # `jvp` inside `quaxify` binds the body's `jvp`: the rule's `jvp` then.
            jvp = _identify_jvp(jaxpr, _registered[source])
            out = None if jvp is None else _rule_jvp(args, params, *jvp)
            if out is not None:
                return out
            if jvp is not None:  # a tangent the rule's `jvp` cannot take
                _refuse_a_body_that_stands_in_for_no_rule(
                    _registered[source], args, params
                )
        if found is None and not _as_traced(jaxpr):
            _refuse_a_body_that_stands_in_for_no_rule(_registered[source], args, params)
            return _noted_body(_TRANSFORMED, *args, jaxpr=jaxpr, **params)
        if candidates and found is None:
            return _noted_body(_OTHER_BODY, *args, jaxpr=jaxpr, **params)
        if found is not None:
            registered, statics = found
            rule = registered_rule(registered.primitive, args, takes=statics)
    if rule is None:
        return _jit_body(*args, jaxpr=jaxpr, **params)

    def call(*a: Any) -> Any:
        return _as_output(jaxpr, _jit_body(*a, jaxpr=jaxpr, **params))

    out = rule(args, {"call": call, **statics})
    leaves = jtu.tree_leaves(out, is_leaf=is_value)
    if len(leaves) != len(jaxpr.out_avals):
        raise TypeError(
            f"the rule registered for `{params['name']}` returned {len(leaves)} "
            f"arrays; the function returns {len(jaxpr.out_avals)}."
        )
    return leaves


_trace.add_staging_rule(jit_p, _jit)


# Which registered function's `jvp` each body met under a registered source is (see
# `_identify_jvp`), or `None`: none is.
_identified_jvps = Table("register_function: the functions of jvp jit bodies", 256)


def _identify_jvp(
    jaxpr: Any, candidates: list[_Registered]
) -> tuple[_Registered, Any, list[bool], list[bool]] | None:
    """The registered function among `candidates` (those of its source) whose `jvp`
    the `jit` body `jaxpr` is, as JAX's `jvp` of the function's `jit` binds it
    (`jvp` inside `quaxify`): with the function's body on the primals' types (its
    static arguments at their defaults), which primals have tangents, and which
    outputs do. JAX drops the argument names of such a body. `None` where none is
    (another transformation: `vmap`, the parts `grad` splits a body into). Kept per
    body while the caches are on (in verify mode, the function and the tangents
    found afresh are compared)."""
    search = ft.partial(_search_jvp, candidates=candidates)
    what = "the registered function whose `jvp` it is, or its tangents"
    return per_jaxpr(_identified_jvps, jaxpr, search, _same_jvp, what)


def _search_jvp(
    jaxpr: Any, candidates: list[_Registered]
) -> tuple[_Registered, Any, list[bool], list[bool]] | None:
    """`_identify_jvp`, computed."""
    info = jaxpr.jaxpr.debug_info
    if info is not None and info.arg_names is None:
        for registered in reversed(candidates):
            found = _jvp_of(registered, jaxpr)
            if found is not None:
                return found
    return None


def _same_jvp(a: Any, b: Any) -> bool:
    """Whether two answers of `_identify_jvp` name one function and its tangents
    (each traces the function's body afresh)."""
    if a is None or b is None:
        return a is b
    return (a[0], a[2], a[3]) == (b[0], b[2], b[3])


def _jvp_of(
    registered: _Registered, jaxpr: Any
) -> tuple[_Registered, Any, list[bool], list[bool]] | None:
    """`registered`'s body, which primals have tangents and which outputs do,
    where `jaxpr` is the `jvp` of the function on its leading `n` arguments (at
    least one of them with a tangent), for some `n`; else `None`."""
    avals = jaxpr.in_avals
    positional, rest = registered.parameters
    for n in range((len(avals) + 1) // 2, len(avals)):
        if rest is None and n > len(positional):
            break
        try:
            body = traced_jit(registered.jitted, avals[:n], {})
        except Exception:  # not a call this function takes: not its body
            continue
        for which in itertools.combinations(range(n), len(avals) - n):
            nonzeros = [i in which for i in range(n)]
            jvp, out_nonzeros = jvp_body(body, nonzeros)
            if _same_body(jvp, jaxpr):
                return registered, body, nonzeros, out_nonzeros
    return None


def _rule_jvp(
    args: Sequence[Any],
    params: dict[str, Any],
    registered: _Registered,
    body: Any,
    nonzeros: list[bool],
    out_nonzeros: list[bool],
) -> list[Any] | None:
    """The outputs of the `jit` of the `jvp` of `registered` (see `_identify_jvp`):
    the `jvp` of the rule that matches its primals, on their tangents (zeros where
    the `jvp` has none). `None` where no rule matches, or where a tangent is not of
    its primal's type (a plain tangent of a value): the body then runs."""
    n = len(nonzeros)
    primals = list(args[:n])
    rule = registered_rule(registered.primitive, primals, takes={})
    if rule is None:
        return None
    given = iter(args[n:])
    tangents = [
        next(given) if nonzero else jtu.tree_map(_zero_tangent, p)
        for p, nonzero in zip(primals, nonzeros, strict=True)
    ]
    if any(
        jtu.tree_structure(p) != jtu.tree_structure(t)
        for p, t in zip(primals, tangents, strict=True)
    ):
        return None
    m = len(body.out_avals)
    out, tangents_out = jax.jvp(_rule_on(rule, body, params), primals, tangents)
    leaves = jtu.tree_leaves(out, is_leaf=is_value)
    tangent_leaves = jtu.tree_leaves(tangents_out, is_leaf=is_value)
    if len(leaves) != m or len(tangent_leaves) != m:
        raise TypeError(
            f"the rule registered for `{params['name']}` returned {len(leaves)} "
            f"arrays; the function returns {m}."
        )
    pairs = zip(tangent_leaves, out_nonzeros, strict=True)
    return leaves + [t for t, nonzero in pairs if nonzero]


def _rule_on(rule: Any, body: Any, params: dict[str, Any]) -> Callable[..., Any]:
    """The function that `rule` (registered for a function whose body on the
    arguments' types is the closed jaxpr `body`) computes on that function's
    arguments, where `params` are those of a `jit` equation whose leading arguments
    and outputs are the function's (its `jvp`, say): the rule's `call` runs `body`
    with `params` cut to the function's arguments and outputs."""
    n, m = len(body.in_avals), len(body.out_avals)
    body_params = {
        **params,
        "in_shardings": params["in_shardings"][:n],
        "out_shardings": params["out_shardings"][:m],
        "in_layouts": params["in_layouts"][:n],
        "out_layouts": params["out_layouts"][:m],
        "donated_invars": params["donated_invars"][:n],
    }

    def call(*a: Any) -> Any:
        return _as_output(body, _jit_body(*a, jaxpr=body, **body_params))

    def function(*p: Any) -> Any:
        return rule(p, {"call": call})

    return function


# The sources of the functions some rule was registered for with a `jvp` (see
# `_jvp_for`).
_sources_with_jvps: set[str] = set()


def _jvp_for(
    primals: Sequence[Any], params: dict[str, Any]
) -> Callable[[list[Any], list[Any]], list[Any]] | None:
    """How JAX differentiates a `jit` with the primal arguments `primals` and the
    params `params` (see `quax._foundation._jit_rules.differentiate_jits_with`): by
    the `jvp` registered with the rule that the values behind `primals` reach, where
    the `jit` is the body of a function registered with one (its static arguments at
    their defaults or at values the rule takes) and `grad`, `jvp`, `linearize`,
    `vjp`, ... (or `vmap` around them) run inside `quaxify`, on its values; else
    `None`, and JAX differentiates the body. Asked on every `jvp` or `linearize`
    of a `jit`, in or out of `quaxify`: where no function registered with a `jvp`
    has the body's source, it answers after one lookup."""
    jaxpr = params["jaxpr"]
    source = body_source(jaxpr)
    if source not in _sources_with_jvps:
        return None
    values = [_value_behind(p) for p in primals]
    if not any(is_value(v) for v in values):
        return None  # plain arrays, or a `jit` body JAX traces: JAX's derivative
    candidates = [r for r in _registered[source] if _in_order(jaxpr, r)]
    found = _identify(jaxpr, candidates) if candidates else None
    if found is None:
        return None
    registered, statics = found
    if registered_rule(registered.primitive, values, takes=statics) is None:
        return None
    rule = resolve(registered.primitive, values).function
    assert rule is not None  # `registered_rule` found one
    jvp = registered.jvps.get(rule)
    if jvp is None:
        return None
    return ft.partial(_run_jvp, jvp, statics, len(jaxpr.out_avals), params["name"])


def _value_behind(primal: Any) -> Any:
    """The value that the tracer `primal` of `jvp`, `linearize` or `vmap` inside
    `quaxify` stands for (see `quax._compat.primal_behind`), or what it holds
    (a plain array, or a staged tracer, whose type quax does not know yet)."""
    x = primal_behind(primal)
    return x.quax_value if type(x) is QuaxTracer else x


def _run_jvp(
    jvp: Callable[..., Any],
    statics: dict[str, Any],
    m: int,
    name: str,
    primals: list[Any],
    tangents: list[Any],
) -> list[Any]:
    """Run the `jvp` registered with a rule for the function `name` (of `m`
    outputs), with the static arguments `statics`, on the `jit`'s primals and
    tangents: the tangents of its outputs, as a list."""
    out = jtu.tree_leaves(jvp(tuple(primals), tuple(tangents), **statics))
    if len(out) != m:
        raise TypeError(
            f"the `jvp` registered with a rule for `{name}` "
            f"(`quax.register_function(..., jvp=...)`) returned {len(out)} "
            f"tangents; the function returns {m} arrays, each with its tangent."
        )
    return out


def _refuse_a_body_that_stands_in_for_no_rule(
    candidates: list[_Registered], args: Sequence[Any], params: dict[str, Any]
) -> None:
    """Raise where a transformation inside `quaxify` (`grad`, `linearize`, `vjp`,
    `jacfwd`, ... split or extended it: see `_as_traced`) changed the body of a
    registered function that its arguments `args` would reach, and the rule that
    their leading values match was registered with `body_stands_in=False`: the
    body, run under the rules, does not compute what that rule does (quax-units'
    `jnp.rad2deg` shows an angle in degrees; its body multiplies the angle's number
    by 180 / pi), so neither does its derivative, and the result would be wrong.
    JAX changes the body before quax meets it, so quax cannot run the rule's
    derivative in its place (`jvp` alone it recognises: see `_identify_jvp`),
    unless the rule was registered with a `jvp` and JAX differentiated the call on
    quax's values (see `_jvp_for`); one registered with a `jvp` reaches here only
    where JAX differentiated the function while it traced a body (a `jax.jit`,
    `jax.checkpoint`, ...) on abstract arguments whose types quax did not know
    yet."""
    for registered in reversed(candidates):
        if not registered.not_stand_ins:
            continue
        positional, rest = registered.parameters
        most = len(args) if rest is not None else min(len(args), len(positional))
        for n in range(1, most + 1):
            leading = args[:n]
            if not any(is_value(a) for a in leading):
                continue
            resolution = resolve(registered.primitive, leading)
            if resolution.kind != "rule":
                continue
            if resolution.function not in registered.not_stand_ins:
                continue
            name = params["name"]
            if resolution.function in registered.jvps:
                raise NotImplementedError(
                    f"`{name}` of {describe_types(leading)} inside a transformation "
                    f"inside `quax.quaxify`, differentiated while JAX traced a body "
                    f"on abstract arguments (`jax.grad` inside `jax.jit`, or "
                    f"`jax.jit`, `eqx.filter_jit` or `jax.checkpoint` inside "
                    f"`jax.grad`, ...): JAX changed the body of `{name}` before quax "
                    f"met it, so neither the rule registered for it with "
                    f"`quax.register_function` nor that rule's `jvp` can run there; "
                    f"and the rule was registered with `body_stands_in=False`: the "
                    f"body, run under the rules instead, does not compute what the "
                    f"rule does, so neither does its derivative, and the result "
                    f"would be wrong. Differentiate directly inside `quaxify`, with "
                    f"the `jit` or `checkpoint` around the derivative "
                    f"(`jax.jit(quax.quaxify(jax.grad(f)))`, where the rule's `jvp` "
                    f"runs), or apply the transformation outside `quaxify`, to the "
                    f"quaxified function (a family's own derivative, such as "
                    f"quax-units' `quax_units.grad(quax.quaxify(f))`)."
                )
            raise NotImplementedError(
                f"`{name}` of {describe_types(leading)} inside a transformation "
                f"inside `quax.quaxify`: `jax.grad`, `value_and_grad`, `vjp`, "
                f"`linearize`, `jacfwd`, `jacrev`, `hessian`, `eqx.filter_grad` "
                f"(or a `vmap` that quax does not recognise as the function's own "
                f"program, or `jvp` with a plain tangent of a value) changed the "
                f"body of `{name}` before quax met it, so the rule registered for "
                f"it with `quax.register_function` cannot run there; and that rule "
                f"was registered with `body_stands_in=False`: the body, run under "
                f"the rules instead, does not compute what the rule does, so "
                f"neither does its derivative, and the result would be wrong. "
                f"Apply the transformation outside `quaxify`, to the quaxified "
                f"function (a family's own derivative, such as quax-units' "
                f"`quax_units.grad(quax.quaxify(f))`, or `jax.vmap(quax.quaxify("
                f"f))`), or compute `{name}` another way inside it (quax-units: "
                f'`q.to("deg")` rather than `jnp.rad2deg(q)`), or register the '
                f"rule with a `jvp` (`quax.register_function({name}, "
                f"body_stands_in=False, jvp=...)`: the tangents of the rule's "
                f"outputs, given its arguments and their tangents), which quax "
                f"runs where JAX differentiates the function on its values."
            )


def _zero_tangent(leaf: Any) -> Any:
    """A zero tangent of an array: of its dtype where it is inexact, else of JAX's
    `float0` (the tangent type of integers and booleans)."""
    if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
        return jnp.zeros_like(leaf)
    return np.zeros(jnp.shape(leaf), jax.dtypes.float0)


def _as_traced(jaxpr: Any) -> bool:
    """Whether `jaxpr` is a function's body as JAX traced it from the function, not
    a transformation of it that keeps its source: `vmap` inside `quaxify` binds the
    batched body (its arguments batched along any axes, which the rule cannot
    know: `jnp.hypot` under `vmap(in_axes=(1, None))` would broadcast a batched
    `(3, B)` against an unbatched `(3,)` along the wrong axis), and `grad`/`jvp`/
    `linearize` bind the body's derivative, its transpose or its parts (other
    functions, of as many arguments where the function is linear). JAX keeps the
    names of the outputs (the result paths) only on a body traced from the
    function; each of those transformations drops them. Such a body runs under the
    rules, primitive by primitive."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    return info is not None and info.result_paths is not None


# Why the rules registered for a function did not run on a body of its source (the
# body then runs under the rules, and an error from it carries this note).
_TRANSFORMED = (
    "`vmap`, `grad`, `jvp` or `linearize` inside `quaxify` transformed its body, "
    "whose arguments a rule cannot read, so the body ran under the rules instead. "
    "Apply the transformation outside `quaxify`, as in `jax.vmap(quax.quaxify(f))`, "
    "for the rule to see the function's own arguments."
)
_OTHER_BODY = (
    "this body is not the one the function gives on these argument types with "
    "its static arguments at their defaults (or at values a rule takes, its "
    "registration's `static`), so the body ran under the rules instead: a static "
    "argument (`jax.jit`'s `static_argnames`) changes what the function computes, "
    "which the rules were not written for, or another function at the same source "
    "line was called. Leave the static arguments at their defaults for the rules to "
    "run, or have the rule take them (`quax.register_function(f, static=...)`)."
)


def _noted_body(why: str, *args: ValueLike, jaxpr: Any, **params: Any) -> list[Any]:
    """Run the body of a `jit` whose source is a registered function's, where its
    rules do not apply (`why`, see above), under the rules; an error from it says
    why the function's rules did not run."""
    try:
        return _jit_body(*args, jaxpr=jaxpr, **params)
    except ValueAsked:
        raise  # an enclosing `jit`'s question, not an error
    except Exception as e:
        e.add_note(
            f"(quax: the rules registered with `quax.register_function` for "
            f"`{params['name']}` did not run: {why})"
        )
        raise


def _as_output(jaxpr: Any, outs: list[Any]) -> Any:
    """The outputs of a `jit` as its function returns them, where that is one array
    (the usual case of the functions rules are registered for), else the list."""
    return outs[0] if len(jaxpr.out_avals) == 1 else outs
