"""Quax's caches (compiled eager programs, replayed recordings, nested `jit`
bodies, the dispatch cache) may only return what running the rules would return.
Each test here plants a case where a cache key once missed something the rules
see, and checks every call against the answer of the rules run afresh."""

import gc
import os
import subprocess
import sys
import threading
from typing import Any

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.__main__ as quax_main
import quax._caching._eager as quax_eager
import quax._caching._keys
import quax._caching._nested as _nested
import quax._caching._per_jaxpr as _per_jaxpr
import quax._caching._replay as _replay
import quax._dispatch._registry as _registry
import quax._dispatch._staged as _staged
import quax._foundation._caches
import quax._rules._bodies as _bodies
import quax._transform._interpreter as _interpreter
import quax.testing
from jax import lax
from jaxtyping import Array, ArrayLike
from quax.zero import Zero, ieee_strict


# Against NumPy's float32 `exp` and powers: an accelerator's differ by more than the
# CPU's (`quax.testing.tolerance`).
F32 = quax.testing.tolerance(np.float32)


@pytest.fixture(autouse=True)
def _compiled() -> Any:
    """Eager compilation on (the default), whatever the session's setting."""
    previous = quax.set_eager_compilation(True)
    yield
    quax.set_eager_compilation(previous)


class Wrapped(quax.ArrayValue):
    """An array in a wrapper, which materialises to it."""

    array: eqx.AbstractVar[Array]

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> Array:
        return self.array


# Aliasing between inputs --------------------------------------------------------------


class Twin(Wrapped):
    """An array, and how the last sum made it: its `add` rule gives a closed form
    (`2 * x`, kind "twice") for one value added to itself, or for two values on
    one array, as a structured family does for `K + K`."""

    array: Array
    kind: str = eqx.field(static=True, default="given")


@quax.register(lax.add_p)
def _(x: Twin, y: Twin, **params: Any) -> Twin:
    if x is y:
        return Twin(2 * x.array, "same value")
    if x.array is y.array:
        return Twin(2 * x.array, "same array")
    return Twin(lax.add_p.bind(x.array, y.array, **params), "sum")


A = jnp.array([1.0, 2.0, 3.0])


def test_aliased_inputs_keyed() -> None:
    add = quax.quaxify(lambda a, b: a + b)
    t, u, v = Twin(A), Twin(A + 0), Twin(A)  # `v` shares `t`'s array only
    for _ in range(3):  # by equation, compiled, replayed: all keyed alike
        assert add(t, u).kind == "sum"
    for _ in range(3):
        assert add(t, t).kind == "same value"
        assert add(t, v).kind == "same array"
        assert add(t, u).kind == "sum"
        assert add(v, t).kind == "same array"
    np.testing.assert_array_equal(add(t, t).array, [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(add(t, u).array, [2.0, 4.0, 6.0])


def test_aliased_inputs_of_a_nested_jit() -> None:
    """A `jit`'s body sees each argument as its own tracer (as in JAX), however
    often it is cached: every call answers as the rules do afresh."""
    add = quax.quaxify(jax.jit(lambda a, b: a + b))
    t, u, v = Twin(A), Twin(A + 0), Twin(A)
    pairs = [(t, u), (t, t), (t, v)]
    with quax.track_materialisation():  # no compiled program, no replay
        fresh = [add(*pair).kind for pair in pairs]
    for _ in range(3):
        assert [add(t, u).kind for _ in range(2)] == [fresh[0]] * 2
        assert [add(*pair).kind for pair in pairs] == fresh


# A nested `jit` called eagerly on fresh plain arrays ----------------------------------


class Metres(Wrapped):
    """An array with a static unit exponent: `pow` by a known exponent raises it,
    reading the exponent through `quax.known_constant` as a units family does."""

    array: Array
    power: float = eqx.field(static=True, default=1.0)


@quax.register(lax.mul_p)
def _(x: Metres, y: ArrayLike, **params: Any) -> Metres:
    return Metres(lax.mul_p.bind(x.array, y, **params), x.power)


@quax.register(lax.add_p)
def _(x: Metres, y: Metres, **params: Any) -> Metres:
    assert x.power == y.power
    return Metres(lax.add_p.bind(x.array, y.array, **params), x.power)


@quax.register(lax.pow_p)
def _(x: Metres, y: ArrayLike, **params: Any) -> Metres:
    known = quax.known_constant(y)
    if known is None or np.unique(known).size != 1:
        raise ValueError("the exponent of a `Metres` must be known, and one number")
    power = x.power * float(known.flat[0])
    return Metres(lax.pow_p.bind(x.array, y, **params), power)


def test_nested_jit_on_fresh_arrays_compiles_once() -> None:
    inner = jax.jit(lambda a, c: a * c + a)
    g = quax.quaxify(lambda a, c: inner(a, c))
    before = _bodies_kept()
    for i in range(50):
        c = jnp.full(100, float(i))  # a fresh array each call
        out = g(Metres(jnp.arange(100.0)), c)
        np.testing.assert_array_equal(out.array, jnp.arange(100.0) * (i + 1))
    assert _bodies_kept() - before == 1


def _bodies_kept() -> int:
    """How many jitted bodies the nested-jit table keeps (its other entries are the
    plain arguments that bodies take by value)."""
    len(_nested._bodies)  # drops the dead jaxprs' entries
    return sum(callable(e) for e in list(_nested._bodies._data.values()))


def test_nested_jit_reading_a_plain_argument_keys_it_by_value() -> None:
    inner = jax.jit(lambda a, c: a**c)
    g = quax.quaxify(lambda a, c: inner(a, c))
    x = jnp.linspace(1.0, 2.0, 100)
    for c in [2.0, 3.0, 2.0, 3.0]:
        # Larger than a constant kept by value: passed in, until the rule asks.
        exponent = jnp.full(100, c)
        out = g(Metres(x), exponent)
        assert out.power == c
        np.testing.assert_allclose(out.array, x**c, **F32)
    for c in [2.0, 3.0]:  # small ones stay constants
        assert g(Metres(x), c).power == c


def test_nested_jit_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_nested._bodies, "bound", 4)
    inner = jax.jit(lambda a, c: a * c)
    g = quax.quaxify(lambda a, c: inner(a, c))
    for n in range(1, 10):  # a shape each: a program each
        out = g(Metres(jnp.ones(n)), jnp.full(n, 2.0))
        np.testing.assert_array_equal(out.array, jnp.full(n, 2.0))
        assert len(_nested._bodies) <= 4


# Registering while another thread dispatches ------------------------------------------


def _probe_type() -> type:
    """A fresh value type with a `sin` rule answering "old" (dispatch never saw it)."""

    class Probe(Wrapped):
        array: Array
        tag: str = eqx.field(static=True, default="given")

    @quax.register(lax.sin_p)
    def _(x: Probe, **params: Any) -> Probe:
        return Probe(lax.sin_p.bind(x.array, **params), "old")

    return Probe


def _register_new(probe: type) -> None:
    @quax.register(lax.sin_p)  # the same signature and owner: replaces "old"
    def _(x: probe, **params: Any) -> probe:  # type: ignore[valid-type]
        return probe(lax.sin_p.bind(x.array, **params), "new")


@pytest.mark.parametrize("verify", [False, True])
def test_rule_registered_during_a_resolution_is_used(
    monkeypatch: pytest.MonkeyPatch, verify: bool
) -> None:
    # In verify mode too: a resolution started before the registration is neither
    # compared nor kept (verify mode kept it as the first resolution of its key, and
    # then called the new rule a mismatch).
    monkeypatch.setattr(quax._foundation._caches, "verifying", verify)
    quax._foundation._caches.invalidate()
    probe = _probe_type()
    original = _registry._warn_if_foreign

    def resolving(*args: Any) -> None:
        # Between the resolution and its caching: another thread registers.
        monkeypatch.setattr(_registry, "_warn_if_foreign", original)
        _register_new(probe)
        original(*args)

    monkeypatch.setattr(_registry, "_warn_if_foreign", resolving)
    sin = quax.quaxify(lax.sin)
    assert sin(probe(A)).tag == "old"  # resolved before the registration
    for _ in range(2):
        out = sin(probe(A))
        assert out.tag == "new"
        np.testing.assert_allclose(out.array, np.sin(np.asarray(A)), rtol=1e-6)


def test_rule_registered_while_threads_dispatch_is_used() -> None:
    sin = quax.quaxify(lax.sin)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(10):
            probe = _probe_type()
            started = threading.Barrier(5)

            def dispatch(probe: type = probe, started: Any = started) -> None:
                started.wait()
                for _ in range(20):
                    sin(probe(A))

            threads = [threading.Thread(target=dispatch) for _ in range(4)]
            for t in threads:
                t.start()
            started.wait()
            _register_new(probe)
            for t in threads:
                t.join()
            assert sin(probe(A)).tag == "new"
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("outer", ["jit", "filter_jit"])
def test_rule_registered_after_a_jit_trace_is_used(outer: str) -> None:
    # JAX's own cache of a `jax.jit` around a quaxified function held the program
    # the old rule gave: after the new rule, the jitted call still answered "old"
    # (its values too: -1 where the new rule gives 10), while the same call without
    # `jit` answered "new".
    probe = _probe_type()
    wrap = jax.jit if outer == "jit" else eqx.filter_jit
    sin = wrap(quax.quaxify(lax.sin))
    assert sin(probe(A)).tag == "old"
    _register_new(probe)
    out = sin(probe(A))
    assert out.tag == "new"
    np.testing.assert_allclose(out.array, np.sin(np.asarray(A)), rtol=1e-6)
    assert quax.quaxify(lax.sin)(probe(A)).tag == "new"


# Concurrent eager calls ---------------------------------------------------------------


def test_concurrent_eager_calls_share_the_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three keys kept: with many shapes, every call drops the oldest.
    monkeypatch.setattr(quax_eager._programs, "bound", 3)
    mul = quax.quaxify(jnp.multiply)
    errors: list[BaseException] = []
    started = threading.Barrier(6)

    def calls(seed: int) -> None:
        started.wait()
        try:
            for i in range(60):
                n = 1 + (seed + i) % 7
                x = jnp.arange(n, dtype=jnp.float32) + seed
                out = mul(Metres(x), 2.0)
                np.testing.assert_array_equal(out.array, 2 * np.asarray(x))
        except BaseException as e:  # reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=calls, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors


# Settings in the compiled eager key ---------------------------------------------------


def test_settings_in_the_compiled_eager_key() -> None:
    """`Zero * b` is a `Zero`, unless IEEE semantics are asked for (`0 * nan` is
    `nan`): the output is dense either way, so only the key tells the two apart."""
    f = quax.quaxify(jax.jit(lambda a, b: jnp.exp(a * b)))
    b = jnp.array([1.0, jnp.nan, 2.0])
    zero = Zero((3,), jnp.float32)
    for _ in range(2):  # by equation, then compiled
        np.testing.assert_array_equal(f(zero, b), [1.0, 1.0, 1.0])
    with ieee_strict():
        for _ in range(2):
            np.testing.assert_array_equal(f(zero, b), [1.0, np.nan, 1.0])
    np.testing.assert_array_equal(f(zero, b), [1.0, 1.0, 1.0])


# One switch, bounds and the report ----------------------------------------------------


class Counted(Wrapped):
    """A `sin` rule that counts its runs."""

    array: Array


_runs = {"sin": 0}


@quax.register(lax.sin_p)
def _(x: Counted, **params: Any) -> Counted:
    _runs["sin"] += 1
    return Counted(lax.sin_p.bind(x.array, **params))


@pytest.mark.caching_behaviour
def test_caching_off_runs_every_rule() -> None:
    f = jax.jit(quax.quaxify(lambda a: (jnp.sin(a), jnp.sin(a))))
    g = quax.quaxify(jnp.sin)
    expected = np.sin(np.asarray(A))
    with quax.caching(False):
        before = _runs["sin"]
        out = f(Counted(A))
        assert _runs["sin"] - before == 2  # no replay of the second `sin`
        traced = quax_eager.programs_traced
        for _ in range(3):
            np.testing.assert_allclose(g(Counted(A)).array, expected, rtol=1e-6)
        assert quax_eager.programs_traced == traced  # no compiled eager program
        assert all(size == 0 for _, size, _ in quax._foundation._caches.report())
    for o in out:
        np.testing.assert_allclose(o.array, expected, rtol=1e-6)
    before = _runs["sin"]
    jax.jit(quax.quaxify(lambda a: (jnp.sin(a), jnp.sin(a))))(Counted(A))
    assert _runs["sin"] - before == 1  # on again: the second is replayed


def test_caching_follows_the_environment() -> None:
    code = (
        "import quax, quax._foundation._caches as c; print(c.is_enabled(), c.verifying)"
    )
    env = {**os.environ, "QUAX_CACHING": "0", "QUAX_VERIFY_CACHES": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["False", "True"], out.stderr


@pytest.mark.caching_behaviour
def test_report_names_every_cache(capsys: pytest.CaptureFixture[str]) -> None:
    g = quax.quaxify(jnp.sin)
    for _ in range(2):
        g(Counted(A))
    assert quax_main.main(["caches"]) == 0
    printed = capsys.readouterr().out
    for name in [
        "dispatch cache",
        "compiled eager programs",
        "replayed recordings",
        "nested jit bodies",
        "jaxpr interpreter: the steps of each jaxpr",
        "jaxprs: whether each stages a value",
        "quaxified bodies of higher-order primitives",
        "register_function: the functions of jit bodies",
        "register_function: the functions of jvp jit bodies",
        "symbolic zeros: the signs of small evaluations",
        "verify mode: what each cache entry was made with",
    ]:
        assert f"  {name}: " in printed
    sizes = {name: size for name, size, _ in quax._foundation._caches.report()}
    assert sizes["compiled eager programs"] >= 1
    assert sizes["dispatch cache"] >= 1


# Verify mode: a key that leaves out a component ---------------------------------------


@pytest.fixture
def verifying(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Verify mode on, from empty caches; `plant(name)` leaves a component out of
    every key."""
    monkeypatch.setattr(quax._foundation._caches, "verifying", True)
    quax._foundation._caches.invalidate()

    def plant(name: str) -> None:
        monkeypatch.setattr(quax._caching._keys, "omitted", frozenset({name}))
        quax._foundation._caches.invalidate()

    yield plant
    quax._foundation._caches.invalidate()


def test_verify_mode_passes_correct_caches(verifying: Any) -> None:
    del verifying
    f = quax.quaxify(jax.jit(lambda a, b: jnp.exp(a * b)))
    h = jax.jit(quax.quaxify(lambda a, b: (a + a, a + b)))
    t, u = Twin(A), Twin(A + 1)
    for _ in range(3):
        np.testing.assert_array_equal(f(Zero((3,), jnp.float32), A), [1.0] * 3)
        twice, mixed = h(t, u)
        assert (twice.kind, mixed.kind) == ("same value", "sum")


def test_verify_mode_catches_settings_left_out(verifying: Any) -> None:
    verifying("settings")
    f = quax.quaxify(jax.jit(lambda a, b: jnp.exp(a * b)))
    b = jnp.array([1.0, jnp.nan, 2.0])
    zero = Zero((3,), jnp.float32)
    for _ in range(2):
        f(zero, b)
    with ieee_strict(), pytest.raises(quax.CacheMismatchError, match="settings"):
        f(zero, b)


def test_verify_mode_catches_aliasing_left_out(verifying: Any) -> None:
    verifying("aliasing")
    h = jax.jit(quax.quaxify(lambda a, b: (a + a, a + b)))
    with pytest.raises(
        quax.CacheMismatchError, match=r"(?s)replayed recordings.*aliasing"
    ):
        h(Twin(A), Twin(A + 1))


def test_verify_mode_catches_settings_left_out_of_nested_jits(
    verifying: Any,
) -> None:
    verifying("settings")
    inner = jax.jit(lambda a, b: a * b)  # a `Zero`, or dense under `ieee_strict`
    f = quax.quaxify(lambda a, b: inner(a, b))
    b = jnp.array([1.0, jnp.nan, 2.0])
    zero = Zero((3,), jnp.float32)
    f(zero, b)
    with ieee_strict(), pytest.raises(quax.CacheMismatchError, match="settings"):
        f(zero, b)


class Label(str):
    """A display text equal to every other (as quax-units' display units are)."""

    def __hash__(self) -> int:
        return hash(Label)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Label)


class Shown(Wrapped):
    """A value with a display label, which `exp` carries through."""

    array: Array
    label: Label = eqx.field(static=True)


@quax.register(lax.exp_p)
def _(x: Shown, **params: Any) -> Shown:
    return Shown(lax.exp_p.bind(x.array, **params), Label(f"exp {x.label}"))


def test_nested_jit_keys_each_display_text() -> None:
    """JAX's own cache of a jitted body compares treedefs by `==`: a body traced
    for one label must not serve another."""
    inner = jax.jit(jnp.exp)
    f = quax.quaxify(lambda a: inner(a))
    for _ in range(2):
        for text in ("m", "km"):
            out = f(Shown(A, Label(text)))
            assert str.__eq__(out.label, f"exp {text}")
            np.testing.assert_allclose(out.array, np.exp(np.asarray(A)), **F32)


def test_verify_mode_catches_a_changed_resolution(
    verifying: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    del verifying
    sin = quax.quaxify(lax.sin)
    sin(Counted(A))  # the first resolution of (sin, Counted)
    planted = _registry.Resolution("materialise", None, "a planted resolution")
    monkeypatch.setattr(_registry, "_resolve", lambda primitive, values: planted)
    with pytest.raises(quax.CacheMismatchError, match="dispatch cache"):
        sin(Counted(A))


# What is worked out once per jaxpr ----------------------------------------------------


def _jaxprs() -> tuple[Any, Any, Any]:
    """Two plain jaxprs (`sin`, `cos`) and one that stages a value."""
    sin = jax.make_jaxpr(jnp.sin)(A)
    cos = jax.make_jaxpr(jnp.cos)(A)
    staging = jax.make_jaxpr(lambda a: _staged.stage_value(Counted(a)))(A)
    return sin, cos, staging


def test_per_jaxpr_tables_give_what_a_fresh_walk_gives() -> None:
    sin, cos, staging = _jaxprs()
    for _ in range(2):  # computed, then kept
        assert not _per_jaxpr.jaxpr_holds_staged_values(sin)
        assert _per_jaxpr.jaxpr_holds_staged_values(staging)
        assert [s.primitive for s in _interpreter._steps_of(cos.jaxpr)] == [lax.cos_p]
        assert _bodies.quaxified_jaxpr(sin) is _bodies.quaxified_jaxpr(sin)
    assert _bodies.quaxified_jaxpr(sin) is not _bodies.quaxified_jaxpr(cos)
    with quax.caching(False):  # nothing kept: a fresh function each time
        assert _bodies.quaxified_jaxpr(sin) is not _bodies.quaxified_jaxpr(sin)
        assert _per_jaxpr.jaxpr_holds_staged_values(staging)
        assert len(_interpreter._steps) == len(_per_jaxpr._holds) == 0


def test_per_jaxpr_entries_go_with_their_jaxpr() -> None:
    table = quax._foundation._caches.Table("a test's jaxprs", 2)
    try:
        kept = [jax.make_jaxpr(lambda a, k=k: a * k)(A) for k in range(3)]
        for j in kept:
            key, parts = quax._caching._keys.jaxpr_key(j)
            table.put(key, (str(j), parts), j)
        assert len(table) == 2  # the bound: the oldest went
        assert table.get(quax._caching._keys.jaxpr_key(kept[0])[0]) is None
        last = quax._caching._keys.jaxpr_key(kept[2])[0]
        assert table.get(last)[0] == str(kept[2])
        del kept[1:], last, j
        gc.collect()
        assert table.get(("no such key",)) is None  # drops the dead jaxprs' entries
        assert len(table) == 0
    finally:
        quax._foundation._caches._tables.remove(table)


def test_a_table_without_codes_reads_its_entries_and_refuses_a_code() -> None:
    # Its `read` is its dict's own `get` (no dead keys to drop first): it sees
    # what `put` keeps, the bound's drops and `clear`; an entry that would go with
    # a code is refused, as no finalizer would drop it.
    table = quax._foundation._caches.Table("a test's structures", 2, coded=False)
    try:
        for k in range(3):
            table.put(("key", k), k)
        assert table.read(("key", 0)) is None  # the bound: the oldest went
        assert table.read(("key", 2)) == 2
        assert table.read(("key", 0), "none") == "none"
        jaxpr = jax.make_jaxpr(lambda a: a * 2)(A)
        with pytest.raises(ValueError, match="go with no code"):
            table.put(("key", 3), 3, jaxpr)
        assert table.read(("key", 3)) is None
        table.clear()
        assert table.read(("key", 2)) is None
    finally:
        quax._foundation._caches._tables.remove(table)


def test_verify_mode_catches_the_jaxpr_left_out(verifying: Any) -> None:
    # With the jaxpr left out of the key, every jaxpr shares one entry: the second
    # library function evaluated quaxified gets the first one's steps.
    verifying("jaxpr")
    quax.set_eager_compilation(False)
    quax.quaxify(jnp.sin)(Counted(A))
    with pytest.raises(
        quax.CacheMismatchError, match=r"(?s)of each jaxpr.*differ.*: jaxpr; the key"
    ):
        quax.quaxify(jnp.cos)(Counted(A))


@pytest.mark.parametrize("table", ["steps", "holds", "functions"])
def test_verify_mode_checks_each_per_jaxpr_table(verifying: Any, table: str) -> None:
    verifying("jaxpr")
    sin, cos, staging = _jaxprs()
    first, then = {
        "steps": (
            lambda: _interpreter._steps_of(sin.jaxpr),
            lambda: _interpreter._steps_of(cos.jaxpr),
        ),
        "holds": (
            lambda: _per_jaxpr.jaxpr_holds_staged_values(sin),
            lambda: _per_jaxpr.jaxpr_holds_staged_values(staging),
        ),
        "functions": (
            lambda: _bodies.quaxified_jaxpr(sin),
            lambda: _bodies.quaxified_jaxpr(cos),
        ),
    }[table]
    name = {
        "steps": "the steps of each jaxpr",
        "holds": "whether each stages a value",
        "functions": "quaxified bodies",
    }[table]
    first()
    with pytest.raises(quax.CacheMismatchError, match=rf"(?s){name}.*: jaxpr;"):
        then()


@pytest.fixture
def verifying_nested(verifying: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Verify mode on, with nested `jit` bodies the only cache of programs that
    serves (no recording kept, whose replay verify mode would catch first; no
    compiled eager program); `plant(name)` leaves a component out of every key."""
    monkeypatch.setattr(_replay._recordings, "bound", 0)
    quax.set_eager_compilation(False)
    return verifying


def _nested_mismatch(what: str, component: str) -> Any:
    """Expect verify mode to find a hit of the nested-jit cache that differs in
    `what`, naming the key `component` left out."""
    return pytest.raises(
        quax.CacheMismatchError,
        match=rf"(?s)nested jit bodies.*{what}.*: {component};",
    )


def test_verify_mode_compares_a_nested_jits_program(verifying_nested: Any) -> None:
    # With the inputs left out of a nested jit's key, the body traced for `c = 2`
    # serves `c = 3`: the outputs' types agree (a plain array), only the program
    # staged (its constant) tells them apart.
    verifying_nested("inputs")
    inner = jax.jit(lambda a, c: a * c)
    f = quax.quaxify(lambda a, c: inner(a, c))
    np.testing.assert_allclose(f(Counted(A), 2.0), 2 * A)
    with _nested_mismatch("the program it stages", "inputs"):
        f(Counted(A), 3.0)


def test_verify_mode_compares_a_nested_jits_constants(verifying_nested: Any) -> None:
    # As above, with the plain argument an array: a constant of the body's program,
    # which its text names but does not show.
    verifying_nested("inputs")
    inner = jax.jit(lambda a, c: a * c)
    f = quax.quaxify(lambda a, c: inner(a, c))
    np.testing.assert_allclose(f(Counted(A), jnp.full(3, 2.0)), 2 * A)
    with _nested_mismatch("the program it stages", "inputs"):
        f(Counted(A), jnp.full(3, 3.0))


def test_verify_mode_compares_the_plain_arguments_a_nested_jit_takes_by_value(
    verifying_nested: Any,
) -> None:
    # With the code left out of the key, what the `pow` jit found (its rule asks for
    # the exponent, which its body then takes by value) serves the `mul` jit on
    # arguments of the same structures, whose rule asks for nothing.
    verifying_nested("code")
    power = quax.quaxify(jax.jit(lambda a, c: a**c))
    times = quax.quaxify(jax.jit(lambda a, c: a * c))
    x = Metres(jnp.linspace(1.0, 2.0, 100))
    exponent = jnp.full(100, 2.0)  # large: passed in, until a rule asks
    assert power(x, exponent).power == 2.0
    with _nested_mismatch("the plain arguments whose values rules ask for", "code"):
        times(x, exponent)


def test_verify_mode_passes_a_nested_jit_traced_again(verifying: Any) -> None:
    # A correct key: each call's body stages what a fresh one does, also for a
    # second structure of the arguments (JAX traces the kept body again).
    del verifying
    quax.set_eager_compilation(False)
    inner = jax.jit(lambda a, c: jnp.sin(a * c))
    f = quax.quaxify(lambda a, c: inner(a, c))
    for c in (2.0, 3.0, 2.0):
        for x in (A, jnp.arange(5.0)):
            np.testing.assert_allclose(f(Counted(x), c), np.sin(x * c), rtol=1e-6)


class Probing(Wrapped):
    """An array whose `sin` rule, on its first run only, also stages a `cos` that
    nothing reads (as a rule that tries a way and drops it does)."""

    array: Array


_probing_runs: list[int] = []


@quax.register(lax.sin_p)
def _(x: Probing, **params: Any) -> Probing:
    if not _probing_runs:
        lax.cos(x.array)
    _probing_runs.append(1)
    return Probing(lax.sin_p.bind(x.array, **params))


def test_verify_mode_passes_a_nested_jit_whose_dead_equations_differ(
    verifying_nested: Any,
) -> None:
    # The kept body's trace holds the `cos` that nothing reads, a fresh body's does
    # not: one program, which verify mode must not tell apart.
    del verifying_nested
    inner = jax.jit(lambda a: lax.sin(a))
    f = quax.quaxify(lambda a: inner(a))
    _probing_runs.clear()
    for _ in range(3):
        out = f(Probing(A))
        np.testing.assert_allclose(out.array, np.sin(np.asarray(A)), **F32)
    assert len(_probing_runs) == 3  # the kept body's trace, and two fresh ones
