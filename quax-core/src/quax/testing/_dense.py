"""`assert_matches_dense`: a quaxified function against the same function on dense
arrays, under eval, `jit`, `vmap`, `grad` and `jvp`."""

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np

from .._transform._quaxify import quaxify
from .._values._value import Value, describe_types, is_value, track_materialisation
from ._compare import difference


__all__ = ["ConformanceReport", "assert_matches_dense", "densify"]

# The batch copies scale every floating-point leaf by these factors.
_BATCH_FACTORS = (1.0, 0.5, 1.5, 0.75, 1.25, 0.25, 1.75, 0.625)


def _densify_value(x: Value) -> Any:
    while is_value(x):
        enable = getattr(x, "enable_materialise", None)
        if enable is not None:
            x = enable()
        x = x.materialise()
    return x


def densify(tree: Any) -> Any:
    """Replace every [`quax.Value`][] in `tree` by its dense array, as the reference
    of `assert_matches_dense` sees it: `x.enable_materialise().materialise()` where
    the type has `enable_materialise`, else `x.materialise()` (repeated while the
    result is itself a value). It is plain, differentiable JAX code.

    **Arguments:**

    - `tree`: any pytree; values are taken as leaves.

    **Returns:**

    The same pytree with arrays in place of values.
    """
    return jtu.tree_map(
        lambda x: _densify_value(x) if is_value(x) else x, tree, is_leaf=is_value
    )


@dataclasses.dataclass
class ConformanceReport:
    """What `assert_matches_dense` checked.

    **Fields:**

    - `checks`: for each check (`"eval"`, `"jit"`, `"vmap"`, `"vmap(quaxify)"`,
        `"quaxify(vmap)"`, `"grad"`, `"jvp"`), `"passed"` or `"skipped: <reason>"`
        (checks turned off by the caller are absent, but for `"eval"`).
    - `out_types`: the type of each output leaf of the quaxified call (values taken
        as leaves), in flattening order.
    """

    checks: dict[str, str] = dataclasses.field(default_factory=dict)
    out_types: list[type] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"  {name}: {outcome}" for name, outcome in self.checks.items()]
        types = ", ".join(t.__qualname__ for t in self.out_types)
        return "\n".join(["conformance checks:", *lines, f"  output types: {types}"])


class _Checker:
    """The shared state of one `assert_matches_dense` call."""

    def __init__(
        self,
        fn: Callable[..., Any],
        densify: Callable[[Any], Any],
        allow_materialise: bool,
        rtol: float | None,
        atol: float | None,
        out_types: Any,
        eager: bool,
        reference: Callable[..., Any],
        signed_zeros: bool,
    ):
        self.fn = fn
        self.densify = densify
        self.allow_materialise = allow_materialise
        self.rtol = rtol
        self.atol = atol
        self.out_types = out_types
        self.eager = eager  # else the dense reference runs under jit
        self.reference = reference  # the function run on the densified arguments
        self.signed_zeros = signed_zeros

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`: op by op where `self.eager`, else as one compiled program
        (non-array leaves static, as `eqx.filter_jit` holds them)."""
        return fn(*args) if self.eager else eqx.filter_jit(fn)(*args)

    @contextlib.contextmanager
    def tracked(self, check: str) -> Iterator[None]:
        """Fail `check` if the block materialises a value (unless allowed)."""
        with track_materialisation() as report:
            yield
        if report and not self.allow_materialise:
            raise AssertionError(
                f"[{check}] the quaxified function materialised values (pass "
                f"allow_materialise=True if that is intended):\n{report}"
            )

    def run_quax(self, check: str, call: Callable[[], Any], track: bool = True) -> Any:
        """`call()` (which runs the quaxified function) with its errors turned into
        failures of `check`, and materialisation tracked unless `track=False`
        (where `call` tracks its quaxified part itself)."""
        with self.tracked(check) if track else contextlib.nullcontext():
            try:
                return call()
            except AssertionError:
                raise
            except Exception as e:
                raise AssertionError(
                    f"[{check}] the quaxified function raised {type(e).__name__}: {e}"
                ) from e

    def densify_output(
        self, check: str, out: Any, what: str = "output", index: int | None = None
    ) -> Any:
        """`out` (or its batch element `index`) densified, or a failure of `check`
        saying how to make it densifiable."""
        try:
            return _densified(self.densify, index, out)
        except Exception as e:
            types = _names(jtu.tree_leaves(out, is_leaf=is_value))
            raise AssertionError(
                f"[{check}] the quaxified {what} (types {types}) could not be "
                f"densified for the comparison: {type(e).__name__}: {e}. Give the "
                "type an `enable_materialise()`, or pass `densify=`."
            ) from e

    def densify_batch(
        self, check: str, out: Any, element: Any, size: int
    ) -> list[Any] | None:
        """The batch elements of `out`, the output of `quaxify(vmap)`, densified one
        by one, where one of its values is not a batch in quax's sense: a value
        built inside the mapped function comes back as `jax.vmap` returns a pytree,
        its leaves stacked, whatever its type makes of stacked leaves (a type with
        no batch axes refuses them; one with its shape as static metadata ignores
        them). Such a value is taken apart into its `size` elements (element `i`
        of every array leaf) and each is densified; the other leaves are densified
        whole and indexed. `None` where every value of `out` is a batch of the
        matching leaf of `element`, the unbatched output (its aval `(size,
        *shape)`): `out` is then densified whole, as before."""
        leaves, treedef = jtu.tree_flatten(out, is_leaf=is_value)
        elements = jtu.tree_leaves(element, is_leaf=is_value)
        if len(elements) != len(leaves):
            return None  # the comparison reports the structures
        stacked = [
            is_value(v) and not _is_batch_of(v, e, size)
            for v, e in zip(leaves, elements, strict=True)
        ]
        if not any(stacked):
            return None

        def split(leaves: list[Any]) -> list[Any]:
            per_leaf = []
            for leaf, apart in zip(leaves, stacked, strict=True):
                if apart:
                    dense = [self.densify(_unstacked(leaf, i)) for i in range(size)]
                else:
                    whole = self.densify(leaf)
                    dense = [_unstacked(whole, i) for i in range(size)]
                per_leaf.append(dense)
            return [treedef.unflatten([d[i] for d in per_leaf]) for i in range(size)]

        try:
            return eqx.filter_jit(split)(leaves)
        except Exception as e:
            raise AssertionError(
                f"[{check}] the batch elements of the quaxified output (types "
                f"{_names(leaves)}) could not be densified for the comparison: "
                f"{type(e).__name__}: {e}. Give the type an `enable_materialise()`, "
                "or pass `densify=`."
            ) from e

    def check_types(self, check: str, out: Any) -> list[type]:
        leaves = jtu.tree_leaves(out, is_leaf=is_value)
        types = [type(x) for x in leaves]
        expected = self.out_types
        if expected is None:
            return types
        if isinstance(expected, list):
            if len(expected) != len(leaves):
                raise AssertionError(
                    f"[{check}] out_types names {len(expected)} output leaves, the "
                    f"quaxified output has {len(leaves)}: {_names(leaves)}"
                )
        else:
            expected = [expected] * len(leaves)
        for i, (leaf, want) in enumerate(zip(leaves, expected, strict=True)):
            if not isinstance(leaf, want):
                raise AssertionError(
                    f"[{check}] output leaf {i} is {describe_types([leaf])}, expected "
                    f"{_type_names(want)}; output types: {_names(leaves)}"
                )
        return types

    def compare(self, check: str, got: Any, want: Any, what: str = "output") -> None:
        got_leaves, got_tree = jtu.tree_flatten(got)
        want_paths, want_tree = jtu.tree_flatten_with_path(want)
        if got_tree != want_tree:
            raise AssertionError(
                f"[{check}] the quaxified {what} has structure {got_tree}, the dense "
                f"reference {want_tree}"
            )
        for g, (path, w) in zip(got_leaves, want_paths, strict=True):
            self.compare_leaf(
                check, f"{what} leaf {jtu.keystr(path) or '<root>'}", g, w
            )

    def compare_leaf(self, check: str, where: str, got: Any, want: Any) -> None:
        problem = difference(got, want, self.rtol, self.atol, self.signed_zeros)
        if problem:
            raise AssertionError(f"[{check}] {where} {problem}")


def _type_names(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(k.__qualname__ for k in t)
    return t.__qualname__


def _names(leaves: Sequence[Any]) -> str:
    """`[Pair, array float32[3]]`: each value by its type, each array by its aval."""
    return f"[{describe_types(leaves)}]"


def _is_float(x: Any) -> bool:
    return eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def _batch(args: tuple[Any, ...], size: int) -> list[tuple[Any, ...]]:
    """`size` copies of `args` whose floating-point array leaves are scaled by
    different factors."""
    copies = []
    for k in range(size):
        factor = _BATCH_FACTORS[k % len(_BATCH_FACTORS)]
        copies.append(
            jtu.tree_map(lambda x, f=factor: x * f if _is_float(x) else x, args)
        )
    return copies


def _stack(copies: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return jtu.tree_map(
        lambda *xs: jnp.stack(xs) if eqx.is_array(xs[0]) else xs[0], *copies
    )


def _unstacked(tree: Any, i: int) -> Any:
    return jtu.tree_map(lambda x: x[i] if eqx.is_array(x) else x, tree)


# The kit's own array work (densifying for a comparison, making and stacking the
# batch's copies) is not what a check checks: it runs compiled, also where the
# `eval` check runs the quaxified function and its dense reference op by op. Each
# is one function kept here, so that JAX's caches serve its compiled program to
# every later call of the same structure, shapes and `densify` (a function given
# as an argument is static, held by identity). Op by op, each primitive of each
# new shape compiled a program of its own: quax-quant's structural-operations
# property test (7 examples, seed 0) compiled 635 programs op by op and 398 so;
# its CPU time, one process, alternating runs: 31.8 and 31.2 s before, 27.1 and
# 29.7 s after.
@eqx.filter_jit
def _densified(densify: Callable[[Any], Any], index: int | None, out: Any) -> Any:
    """`densify(out)`, or of its batch element `index`."""
    return densify(out if index is None else _unstacked(out, index))


_batched = eqx.filter_jit(_batch)
_stacked = eqx.filter_jit(_stack)


def _is_batch_of(value: Any, element: Any, size: int) -> bool:
    """Whether `value` says it is a batch of `size` of `element` (a value or an
    array): its aval is `(size, *shape)` for `element`'s shape."""
    try:
        shape = element.aval().shape if is_value(element) else jnp.shape(element)
        return tuple(value.aval().shape) == (size, *shape)
    except Exception:
        return False  # e.g. a type with no batch axes refuses stacked leaves


def _stacking_problem(
    args: tuple[Any, ...], stacked: tuple[Any, ...], size: int
) -> str:
    """Why stacking the leaves of a value in `args` does not give a valid batched
    value of the same type (`""` when it does)."""
    values = jtu.tree_leaves(args, is_leaf=is_value)
    batched = jtu.tree_leaves(stacked, is_leaf=is_value)
    for value, batch in zip(values, batched, strict=True):
        if not is_value(value) or not any(map(eqx.is_array, jtu.tree_leaves(value))):
            continue
        name = type(value).__qualname__
        try:
            aval, batch_aval = value.aval(), batch.aval()
        except Exception as e:
            return f"a {name} with stacked leaves has no aval ({type(e).__name__}: {e})"
        want = (size, *aval.shape)
        if tuple(batch_aval.shape) != want or batch_aval.dtype != aval.dtype:
            return (
                f"stacking the leaves of a {name} of shape {aval.shape} gives a "
                f"{name} of shape {tuple(batch_aval.shape)}, not {want}: its shape "
                "is static metadata, so a batch of them exists only inside jax.vmap"
            )
    return ""


def _no_batch_reason(args: tuple[Any, ...]) -> str:
    if not any(map(eqx.is_array, jtu.tree_leaves(args))):
        leafless = [
            type(v).__qualname__
            for v in jtu.tree_leaves(args, is_leaf=is_value)
            if is_value(v)
        ]
        return (
            "no argument has an array leaf to batch over "
            f"(values without array leaves: {', '.join(leafless) or 'none'})"
        )
    return ""


def assert_matches_dense(
    fn: Callable[..., Any],
    *args: Any,
    eval: bool = True,
    jit: bool = True,
    vmap: bool = True,
    grad: bool = True,
    jvp: bool = True,
    allow_materialise: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    out_types: type | tuple[type, ...] | list[type | tuple[type, ...]] | None = None,
    densify: Callable[[Any], Any] = densify,
    batch_size: int = 2,
    seed: int = 0,
    reference: Callable[..., Any] | None = None,
    signed_zeros: bool = False,
) -> ConformanceReport:
    """Check that `quax.quaxify(fn)` computes what `fn` computes on dense arrays.

    ```python
    x = MyValue(...)
    quax.testing.assert_matches_dense(lambda x, y: x @ y + 1, x, y, out_types=MyValue)
    ```

    The reference is `fn(*densify(args))`, plain JAX. Every output leaf of the
    quaxified call (values densified the same way) must have the reference's
    structure, shape and dtype, and its values within `tolerance(dtype)` (integers
    and booleans exactly), NaN exactly where the reference has NaN, the same
    infinities and, with `signed_zeros=True`, zeros of the same sign. The checks,
    each failing with an `AssertionError` that names it (`[eval]`, `[jit]`, ...),
    the output leaf, and the max abs/rel error:

    - `eval`: `quax.quaxify(fn)(*args)`, op by op (each primitive compiled on its
        own: the costly check for programs of many small operations).
    - `jit`: `jax.jit(quax.quaxify(fn))(*args)`, against the reference under
        `jax.jit` (XLA may compile an operation otherwise than JAX runs it alone,
        as `exp(inf) - inf`: `-inf` compiled, NaN op by op).
    - `vmap`: a batch of `batch_size` copies of `args` whose floating-point leaves
        are scaled by different positive factors (integer leaves, e.g. sparse
        indices, are kept), stacked leaf-wise. `jax.vmap(quax.quaxify(fn))` over
        it (`"vmap(quaxify)"`) and `quax.quaxify(jax.vmap(fn))` (`"quaxify(vmap)"`)
        are compared with `fn` on each densified copy, under `jax.jit` as they
        run. The second needs argument values whose stacked leaves form a valid
        batched value (aval `(batch_size, *shape)`); for a type whose shape is
        static metadata it is skipped, with the reason in the returned report. Its
        output values that are batches (aval `(batch_size, *shape)`) are densified
        whole; any other output value (one built inside `fn`, whose leaves
        `jax.vmap` stacked, as of a type with no batch axes) is taken apart into
        its batch elements, each densified and compared on its own, as
        `vmap(quaxify)` compares its output. Non-array leaves (e.g. a leafless
        `Zero`) are not batched; where the output holds a value without array
        leaves, `vmap(quaxify)` is skipped (`jax.vmap` cannot batch it, and quax
        refuses).
    - `grad`: with respect to every floating-point array leaf of `args` (values'
        leaves included): the vector-Jacobian product of the quaxified call, with a
        fixed random cotangent on the densified output, against the gradient of
        `sum(fn(*densify(args)) * cotangent)`.
    - `jvp`: the same leaves, a fixed random tangent, the densified output tangent.

    Everything the quaxified function does (not the densifying of its inputs and
    outputs for the comparison) runs inside [`quax.track_materialisation`][]: unless
    `allow_materialise=True`, a check fails if anything was materialised, and prints
    the report (which primitive densified which type).

    The transforms (`jit`, `vmap`, `grad`, `jvp`) act on the array leaves of
    `args`; their other leaves (functions, Python numbers, as in an equinox model)
    are held static, as `eqx.filter_jit` does.

    **Arguments:**

    - `fn`: a function of arrays (it need not know about quax).
    - `*args`: its arguments: pytrees of arrays and [`quax.Value`][]s.
    - `eval`, `jit`, `vmap`, `grad`, `jvp`: run that check (all by default). `grad`
        and `jvp` are skipped, with the reason in the report, when neither the
        arguments nor the outputs have floating-point leaves. `eval=False` runs
        nothing op by op: the dense reference runs under `jax.jit` too, and the
        report says `"eval": "skipped: eval=False"`. (The densifying of arguments
        and outputs for the comparisons, and the making of the vmap batch, always
        run as compiled programs: they are the kit's work, not the function's.)
        One of `eval` and `jit` must stay on (a `ValueError` otherwise): it
        compares the values and the output types the other checks start from.
    - `allow_materialise`: whether the quaxified function may materialise values.
    - `rtol`, `atol`: override `tolerance(dtype)` for every comparison.
    - `out_types`: the expected type(s) of the quaxified output leaves (values taken
        as leaves): a type or tuple of types that every output leaf must be an
        instance of, or a Python `list` with one such entry per output leaf in
        flattening order. Checked under eval, jit and both vmaps. E.g.
        `out_types=BCOO`, `out_types=[Unitful, jax.Array]`.
    - `densify`: how to densify values for the reference and the comparison
        (default [`quax.testing.densify`][]), for a type that refuses to
        materialise and has no `enable_materialise`.
    - `batch_size`: the number of copies in the vmap batch.
    - `seed`: seeds the random cotangents and tangents.
    - `reference`: the dense function, where it is not `fn`: for a `fn` that builds
        values inside from its plain arguments, the same computation on arrays (see
        [`quax.testing.strategies.calls`][]).
    - `signed_zeros`: whether a zero of a floating-point reference must be a zero
        of the same sign (`1 / x` tells `-0.0` from `0.0`). Turn it on where the
        operation defines the sign, as elementwise arithmetic on a value that holds
        every entry does; off by default, as a structure's zeros that no entry
        holds (symbolic zeros, a sparse matrix's, a product skipping zero terms)
        are `0.0` where dense arithmetic may give `-0.0`.

    **Returns:**

    A [`quax.testing.ConformanceReport`][]: each check `"passed"` or `"skipped:
    <reason>"`, and the output types.

    **Raises:**

    `AssertionError` on the first check that fails; `ValueError` for `eval=False`
    with `jit=False`.
    """
    if not (eval or jit):
        raise ValueError(
            "assert_matches_dense needs `eval=True` or `jit=True` to check the "
            "values; keep `jit=True` where the op-by-op `eval` is too slow."
        )
    checker = _Checker(
        fn,
        densify,
        allow_materialise,
        rtol,
        atol,
        out_types,
        eval,
        fn if reference is None else reference,
        signed_zeros,
    )
    report = ConformanceReport()
    # The transforms see the array leaves; the rest (functions, Python numbers, as
    # in an equinox model) is closed over, as `eqx.filter_jit` would.
    dynamic, static = eqx.partition(args, eqx.is_array)
    call = lambda *d: fn(*eqx.combine(d, static))
    # The arguments are densified under the name of the first check that runs.
    first = "eval" if eval else "jit"
    reference = lambda *d: checker.reference(
        *checker.densify_output(first, eqx.combine(d, static), "function's arguments")
    )
    if eval:
        out = checker.run_quax("eval", lambda: quaxify(fn)(*args))
        report.out_types = checker.check_types("eval", out)
        want = reference(*dynamic)
        checker.compare("eval", checker.densify_output("eval", out), want)
        report.checks["eval"] = "passed"
    else:
        out = None
        want = checker.run(reference, *dynamic)
        report.checks["eval"] = "skipped: eval=False"
    if jit:
        jitted = checker.run_quax("jit", lambda: jax.jit(quaxify(call))(*dynamic))
        types = checker.check_types("jit", jitted)
        # Against the dense function under `jit` too: XLA compiles some operations
        # otherwise than JAX runs them one by one (`exp(inf) - inf` is not NaN).
        want_jit = eqx.filter_jit(reference)(*dynamic) if eval else want
        checker.compare("jit", checker.densify_output("jit", jitted), want_jit)
        report.checks["jit"] = "passed"
        if out is None:
            out, report.out_types = jitted, types

    if vmap:
        _check_vmap(checker, report, dynamic, static, batch_size, out)

    if grad or jvp:
        _check_derivatives(checker, report, args, want, grad, jvp, seed)
    return report


def _check_vmap(
    checker: _Checker,
    report: ConformanceReport,
    dynamic: tuple[Any, ...],
    static: tuple[Any, ...],
    size: int,
    out: Any,
) -> None:
    """The vmap checks; `out` is the quaxified output of the eval or jit check."""
    fn, densify = checker.fn, checker.densify
    reason = _no_batch_reason(dynamic)
    if reason:
        report.checks["vmap"] = f"skipped: {reason}"
        return

    def call(*d: Any) -> Any:
        return fn(*eqx.combine(d, static))

    copies = _batched(dynamic, size)
    stacked = _stacked(copies)
    reference = lambda c: checker.reference(*densify(eqx.combine(c, static)))
    # Under `jit`, as the quaxified batches run.
    wants = [eqx.filter_jit(reference)(c) for c in copies]
    want = _stacked(wants)

    check = "vmap(quaxify)"
    leafless = [
        type(x).__qualname__
        for x in jtu.tree_leaves(out, is_leaf=is_value)
        if is_value(x) and not jtu.tree_leaves(x)
    ]
    if leafless:
        # `jax.vmap` has no leaf to give the batch axis to: quax refuses it.
        report.checks[check] = (
            f"skipped: the output holds a {leafless[0]} without array leaves, "
            "which jax.vmap cannot batch (quaxify(vmap) sees the batched shapes)"
        )
    else:
        mapped = checker.run_quax(
            check, lambda: jax.jit(jax.vmap(quaxify(call)))(*stacked)
        )
        checker.check_types(check, mapped)
        for i, w in enumerate(wants):
            checker.compare(
                check,
                checker.densify_output(check, mapped, index=i),
                w,
                f"batch element {i}",
            )
        report.checks[check] = "passed"

    check = "quaxify(vmap)"
    problem = _stacking_problem(
        eqx.combine(dynamic, static), eqx.combine(stacked, static), size
    )
    if problem:
        report.checks[check] = f"skipped: {problem}"
        return
    # Inside `quaxify` each value is one tracer: mapped where it has array leaves.
    value_axes = jtu.tree_map(
        lambda x: 0 if jtu.tree_leaves(x) else None, dynamic, is_leaf=is_value
    )
    batched = checker.run_quax(
        check,
        lambda: jax.jit(quaxify(jax.vmap(call, in_axes=value_axes)))(*stacked),
    )
    checker.check_types(check, batched)
    elements = checker.densify_batch(check, batched, out, size)
    if elements is None:
        checker.compare(check, checker.densify_output(check, batched), want)
    else:
        for i, (got, w) in enumerate(zip(elements, wants, strict=True)):
            checker.compare(check, got, w, f"batch element {i}")
    report.checks[check] = "passed"


def _random_like(key: Any, tree: Any) -> Any:
    """A random array for each floating-point leaf of `tree` (float0 zeros for the
    others, as JAX's tangents and cotangents of integer arrays)."""
    leaves, treedef = jtu.tree_flatten(tree)
    keys = jr.split(key, max(len(leaves), 1))
    out = []
    for k, x in zip(keys, leaves, strict=False):
        if _is_float(x):
            out.append(jr.normal(k, jnp.shape(x), jnp.result_type(x)))
        else:
            out.append(np.zeros(jnp.shape(x), jax.dtypes.float0))
    return jtu.tree_unflatten(treedef, out)


def _check_derivatives(
    checker: _Checker,
    report: ConformanceReport,
    args: tuple[Any, ...],
    want: Any,
    grad: bool,
    jvp: bool,
    seed: int,
) -> None:
    fn, densify = checker.fn, checker.densify
    diff, static = eqx.partition(args, eqx.is_inexact_array)
    reason = ""
    if not jtu.tree_leaves(diff):
        reason = "no argument has a floating-point array leaf"
    elif not any(map(_is_float, jtu.tree_leaves(want))):
        reason = "no output is floating-point"
    if reason:
        for name, on in (("grad", grad), ("jvp", jvp)):
            if on:
                report.checks[name] = f"skipped: {reason}"
        return

    def quax_call(d: Any) -> Any:
        return quaxify(fn)(*eqx.combine(d, static))

    def dense_call(d: Any) -> Any:
        return checker.reference(*densify(eqx.combine(d, static)))

    key_ct, key_t = jr.split(jr.key(seed))
    # Each derivative runs as one jitted program: one compilation, not one per
    # primitive. Only the quaxified call is tracked, not the densifying after it.
    if grad:
        cotangent = _random_like(key_ct, want)

        def quax_grad(d: Any) -> Any:
            with checker.tracked("grad"):
                out, pullback = jax.vjp(quax_call, d)
            (out_ct,) = jax.vjp(densify, out)[1](cotangent)
            return pullback(out_ct)[0]

        got = checker.run_quax("grad", lambda: jax.jit(quax_grad)(diff), track=False)
        expected = jax.jit(lambda d: jax.vjp(dense_call, d)[1](cotangent)[0])(diff)
        checker.compare("grad", got, expected, "gradient")
        report.checks["grad"] = "passed"
    if jvp:
        tangent = _random_like(key_t, diff)

        def quax_jvp(d: Any) -> Any:
            with checker.tracked("jvp"):
                out, out_t = jax.jvp(quax_call, (d,), (tangent,))
            return jax.jvp(densify, (out,), (out_t,))[1]

        got = checker.run_quax("jvp", lambda: jax.jit(quax_jvp)(diff), track=False)
        expected = jax.jit(lambda d: jax.jvp(dense_call, (d,), (tangent,))[1])(diff)
        checker.compare("jvp", got, expected, "output tangent")
        report.checks["jvp"] = "passed"
