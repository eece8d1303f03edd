"""Tests written for mutants of the core's caches (`quax/_caching/`) that a sampled
run of `scripts/mutation.sh` let through (see `docs/mutation.md`), each failing with
its mutant planted: what a replayed recording may hold, how a body that cannot be
replayed is marked, what verify mode names when a replay differs, which eager calls
compile one program (with its barriers, which a CPU keeps), how a nested `jit`'s
shardings are passed on, and what is kept per jaxpr."""

import gc
from typing import Any

import equinox as eqx
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax._caching._eager as quax_eager
import quax._caching._per_jaxpr as _per_jaxpr
import quax._caching._replay as quax_replay
import quax._foundation._caches
from jax import lax
from jaxtyping import ArrayLike

from .helpers import (
    CHECKPOINT_LOWER,
    CHECKPOINT_UPPER,
    Dense,
    Refusing,
    Scaled,
    checkpoint_building_values,
    compiles_eager_programs,
)


@pytest.fixture(autouse=True)
def fresh() -> Any:
    quax_replay._recordings.clear()
    yield
    quax_replay._recordings.clear()


# The array that `ReadsEnclosing`'s rule adds: set by the test, a tracer of an
# enclosing `jit` (the rule closes over it, as it is no input of the bind).
_enclosing: list[Any] = []


class ReadsEnclosing(Dense):
    """A `Dense` whose negation adds the last array of `_enclosing`."""


@quax.register(lax.neg_p)
def _(x: ReadsEnclosing) -> jax.Array:
    return lax.add(lax.neg(x.array), _enclosing[-1])


def test_a_rule_reading_an_enclosing_tracer_is_not_replayed() -> None:
    """A rule whose equation reads a tracer of an enclosing `jit` (closed over, not
    an input) is run again on the next bind of the same key, not replayed: a replay
    would give every later bind that first tracer (mutant `_record` 40 kept it in
    the recording, and the second inner `jit` below added `a` instead of `b`)."""

    def outer(a: jax.Array, b: jax.Array) -> list[jax.Array]:
        out = []
        for t in (a, b):
            _enclosing.append(t)
            # A fresh function each time, so that JAX's own tracing cache never
            # answers: each is staged in its own inner trace, with one key.
            inner = jax.jit(lambda v: quax.quaxify(lax.neg)(ReadsEnclosing(v)))
            try:
                out.append(inner(jnp.arange(3.0)))
            finally:
                _enclosing.clear()  # no tracer kept past its trace
        return out

    a, b = jnp.full(3, 10.0), jnp.full(3, 20.0)
    got = jax.jit(outer)(a, b)
    v = np.arange(3.0)
    np.testing.assert_array_equal(got[0], -v + 10.0)
    np.testing.assert_array_equal(got[1], -v + 20.0)


class AsksAboutTracers(Dense):
    """A `Dense` whose sine asks `quax.known_constant` about its traced leaf."""


@quax.register(lax.sin_p)
def _(x: AsksAboutTracers) -> AsksAboutTracers:
    assert quax.known_constant(x.array) is None  # a traced input: not known
    return AsksAboutTracers(lax.sin(x.array))


@pytest.mark.caching_behaviour
def test_a_rule_that_asked_about_a_tracer_is_marked_to_run_every_time() -> None:
    """A primitive whose rule asked `quax.known_constant` about a tracer is marked,
    under its own key, to run its rule every time, and nothing else is kept (mutant
    `_replay_or_run` 103 put the mark under the mark itself, as a key, with the
    code as its entry: an inlined `jit`'s jaxpr, which the table then kept alive)."""
    # The output value's leaf is the jaxpr's output.
    jaxpr = jax.make_jaxpr(quax.quaxify(lax.sin))(AsksAboutTracers(jnp.arange(3.0)))
    np.testing.assert_allclose(
        jax.extend.core.jaxpr_as_fun(jaxpr)(jnp.arange(3.0))[0], np.sin(np.arange(3.0))
    )
    entries = dict(quax_replay._recordings._data)
    assert quax_replay._RUN not in entries
    assert list(entries.values()) == [quax_replay._RUN]


X = jnp.array([0.5, -1.5, 2.25, 3.0])
Y = jnp.array([1.25, 2.0, -0.75, 4.0])


@pytest.fixture
def eager_compilation() -> Any:
    previous = quax.set_eager_compilation(True)
    yield
    quax.set_eager_compilation(previous)


def _runs_compiled(call: Any, expected: np.ndarray) -> None:
    """`call()` gives `expected` each time, and its third call runs one compiled
    program: no equation evaluated one by one (a key's second call compiles it)."""
    for _ in range(2):
        np.testing.assert_array_equal(call().array, expected)
    with quax.plugins.track_evaluations() as report:
        np.testing.assert_array_equal(call().array, expected)
    assert report.total == 0


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_library_code_on_one_value_twice_runs_compiled(eager_compilation: Any) -> None:
    """`K * K`, the same value twice, runs as one compiled program that rebuilds the
    value once and passes it twice (mutant `_compile` 31 passed `None` the second
    time: the trace failed, and every call ran equation by equation)."""
    k = Dense(X)
    square = quax.quaxify(jnp.multiply)
    _runs_compiled(lambda: square(k, k), np.asarray(X * X))


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_a_compiled_eager_program_keeps_its_barriers(eager_compilation: Any) -> None:
    """The compiled eager program keeps its optimisation barriers through XLA's
    passes (compiled with `KEEP_BARRIERS`), which keep each equation's rounding.
    Under the tests' XLA flags (optimisation level 0) XLA contracts no multiply and
    add, so the bits alone cannot show a program compiled without them (mutant
    `_rounding_each_step` 19): its optimised text shows the barriers gone."""
    a, b = Dense(X), Dense(Y)
    subtract = quax.quaxify(jnp.subtract)
    _runs_compiled(lambda: subtract(a, b), np.asarray(X - Y))
    (program,) = [
        e for k, e in quax_eager._programs._data.items() if k[0] == id(jnp.subtract)
    ]
    assert "opt-barrier" in program.lower(X, Y).compile().as_text()


def test_barriers_are_checked_on_the_platform_asked_about() -> None:
    """`_barriers_hold` checks the backend of the platform it is asked about: one
    this process has no backend for keeps nothing, and the check does not raise
    (mutant `_barriers_hold` 6 checked the default backend's device instead, which
    keeps them on a CPU)."""
    try:
        assert quax_eager._barriers_hold("no-such-platform") is False
    finally:
        quax_eager._barriers_checked.pop("no-such-platform", None)


def test_a_nested_jit_with_shardings_keeps_them() -> None:
    """A nested `jit` given `in_shardings` (for a value, a traced array, and none
    for another) is jitted with those of its traced plain arguments only: the
    result is plain JAX's, laid out as asked. Mutant `_jitted` 30 passed them under
    a wrong keyword, which `jax.jit` refuses; mutant `call_body` 22 passed the
    value's too, which JAX then asks of each of its leaves, and the value's scalar
    leaf cannot be split by rows. One device shows no other layout, so the staged
    program tells the rest: its nested `jit` holds the traced array's sharding, as
    plain JAX's does (mutant `_jitted` 28 staged it with none)."""
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    def f(v: Any, a: jax.Array, b: jax.Array) -> Any:
        inner = jax.jit(lambda v, a, b: v * (a + b), in_shardings=(rows, rows, None))
        return inner(v, a, b)

    out = jax.jit(quax.quaxify(f))(Scaled(X, jnp.asarray(3.0)), Y, 2 * Y)
    assert type(out) is Scaled
    np.testing.assert_array_equal(out.array, X * (Y + 2 * Y))
    np.testing.assert_array_equal(out.scale, 3.0)
    assert out.array.sharding.is_equivalent_to(rows, 1)
    closed = jax.make_jaxpr(quax.quaxify(f))(Scaled(X, jnp.asarray(3.0)), Y, 2 * Y)
    (nested,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "jit"]
    given = nested.params["in_shardings"]
    # The value's leaves come first, `a` and `b` last: `a`'s sharding is staged, and
    # the value's is not (JAX would ask it of each leaf).
    named = jax.sharding.NamedSharding
    assert [isinstance(s, named) for s in given] == [False, False, True, False]
    assert given[2] == rows


def test_a_checkpoint_on_plain_operands_whose_body_builds_values() -> None:
    """`jax.checkpoint` of plain operands whose body builds values (its params hold
    an open jaxpr) runs under the quax trace, by the values' rules (mutant
    `_param_holds` 2 read an open jaxpr as `None`, and raised)."""
    x = jnp.array([0.5, 1.0, 2.0])
    got = quax.quaxify(checkpoint_building_values)(x)
    assert type(got) is Refusing
    want = np.where(x > CHECKPOINT_LOWER, x, CHECKPOINT_UPPER)
    np.testing.assert_array_equal(got.array, want)


def test_what_cannot_be_weakly_referenced_is_computed_not_kept() -> None:
    """`per_jaxpr` on an object that cannot be weakly referenced (no jaxpr of this
    JAX: both kinds can be) computes it each time and keeps nothing (mutant
    `per_jaxpr` 5 computed it on `None`)."""
    table = quax._foundation._caches.Table("a test's objects", 4)
    try:
        for _ in range(2):
            assert _per_jaxpr.per_jaxpr(table, (1, 2, 3), len, int.__eq__, "") == 3
        assert len(table) == 0
    finally:
        quax._foundation._caches._tables.remove(table)


class UnitScalar(Dense):
    """A `Dense` scalar known to be positive: its sign, a constant, is a plain
    `1.0` that its rule makes (staged as a literal while JAX stages the program)."""


@quax.register(lax.sign_p)
def _(x: UnitScalar) -> jax.Array:
    del x
    return jnp.asarray(np.float32(1.0))


def test_a_constant_output_of_a_rule_is_replayed() -> None:
    """A rule whose output is a constant it made (the literal `1.0`) is recorded
    with it, and a later bind of the same key gives that constant, as plain JAX's
    `sign` of a positive number does (mutant `_read` 8 called `atom_tracer`
    without the constant's kind: a `TypeError` on the replay)."""
    sign = quax.quaxify(lax.sign)
    for a in (np.float32(2.0), np.float32(3.0)):
        out = jax.jit(lambda v: (sign(UnitScalar(v)), sign(UnitScalar(v * 2))))(a)
        assert [o.dtype for o in out] == [np.float32] * 2
        np.testing.assert_array_equal(out, [np.sign(a)] * 2)


# The factor `Drifting`'s cosine is scaled by: read by its rule, held by no key.
_drift = [1.0]


class Drifting(Dense):
    """A `Dense` whose cosine rule reads `_drift`, which no cache key holds: a rule
    that verify mode must catch."""


@quax.register(lax.cos_p)
def _(x: Drifting) -> Drifting:
    return Drifting(lax.cos(x.array) * _drift[0])


def test_verify_mode_names_the_primitive_whose_rules_staged_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In verify mode, a replayed primitive whose rule stages otherwise when run
    afresh raises, naming the primitive (mutant `_replay_or_run` 76 named an
    inlined `jit` for a primitive, and read a jaxpr's `name` for an inlined `jit`)."""
    monkeypatch.setattr(quax._foundation._caches, "verifying", True)
    quax._foundation._caches.invalidate()
    try:
        cos = jax.jit(lambda v: quax.quaxify(lax.cos)(Drifting(v)))
        out = cos(jnp.arange(3.0)).array
        np.testing.assert_allclose(out, np.cos(np.arange(3.0)), rtol=1e-6)
        _drift[0] = 2.0
        with pytest.raises(
            quax.CacheMismatchError,
            match=r"replayed recordings.*in the equations staged \(of cos\)",
        ):
            jax.jit(lambda v: quax.quaxify(lax.cos)(Drifting(v)))(jnp.arange(3.0))
    finally:
        _drift[0] = 1.0
        quax._foundation._caches.invalidate()


def test_a_cpu_keeps_the_barriers_of_eager_programs() -> None:
    """XLA's CPU compiler keeps optimisation barriers (a program compiled with
    `KEEP_BARRIERS` shows them in its optimised text), and the check says so: on a
    CPU, eager calls run as compiled programs (mutants `_barriers_kept_on` 30 and 33
    broke the check's own program, read as "not kept": every eager call on a CPU
    ran equation by equation, and the tests of compiled programs skipped)."""
    device = jax.devices("cpu")[0]
    x = jax.device_put(np.full(8, 0.1, np.float32), device)
    program = jax.jit(
        lambda x: lax.optimization_barrier(x * np.float32(10.0)) - 1,
        compiler_options=quax_eager.KEEP_BARRIERS,
    )
    text = program.lower(x).compile().as_text()
    assert text is not None and "opt-barrier" in text
    assert quax_eager._barriers_kept_on(device) is True


class SaysKnown(Dense):
    """A `Dense` whose negation says, in its leaf `known` (1 or 0: a leaf, so that
    the output's structure is the same either way), whether its rule knew the
    array's value (`quax.known_constant`)."""

    known: jax.Array = eqx.field(default_factory=lambda: jnp.float32(0.0))


@quax.register(lax.neg_p)
def _(x: SaysKnown) -> SaysKnown:
    known = quax.known_constant(x.array)
    return SaysKnown(-x.array, jnp.float32(known is not None))


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_a_rule_asking_for_a_leaf_eagerly_is_answered_on_every_call(
    eager_compilation: Any,
) -> None:
    """Eagerly a value's leaves are concrete, and a rule asking `known_constant`
    about one is answered: its calls never run as a compiled program, where the
    leaf would be a tracer and the rule answered otherwise (mutant `_compile` 50
    traced the program with no eager program marked as traced, so the rule was
    told nothing there: the third call said it did not know)."""
    negative = quax.quaxify(jnp.negative)
    for _ in range(3):  # the third call would run a compiled program
        out = negative(SaysKnown(X))
        assert out.known == 1.0
        np.testing.assert_array_equal(out.array, -np.asarray(X))


@pytest.mark.caching_behaviour
@compiles_eager_programs
def test_values_on_one_leaf_run_as_one_compiled_program(eager_compilation: Any) -> None:
    """Two values built on one array, alone or beside a small plain array, run as
    one compiled program that gets the shared leaf once (mutant `_program_key` 41
    lost the distinct leaves where two were one object: beside a plain array, the
    key's check against the plain inputs raised a `TypeError` on the first call;
    alone, the program failed to trace, and every call ran uncompiled, with the
    same results)."""
    y, x = np.asarray(Y), np.asarray(X)
    pair = jax.jit(lambda a, b: 10 * a + b)
    digits = jax.jit(lambda a, b, c: 100 * a + 10 * b + c)
    for fn, plain, expected in (
        (pair, (), 10 * y + y),
        (digits, (X,), 100 * y + 10 * y + x),
    ):
        for _ in range(3):  # the second call compiles the program, the third runs it
            out = quax.quaxify(fn)(Dense(Y), Dense(Y), *plain)
            np.testing.assert_array_equal(out.array, expected)
        (program,) = [
            e for k, e in quax_eager._programs._data.items() if k[0] == id(fn)
        ]
        assert program is not quax_eager._BY_EQUATION


@compiles_eager_programs
def test_verify_mode_checks_a_compiled_eager_program(
    eager_compilation: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In verify mode, a hit of a compiled eager program is staged afresh and
    compared with what the program was made with: a rule that stages otherwise on
    a later call (it reads `_drift`, which no key holds) raises (mutants
    `call_compiled` 117 and 139 kept what the program was made with, or looked it
    up, under another name: nothing was ever compared)."""
    monkeypatch.setattr(quax._foundation._caches, "verifying", True)
    quax._foundation._caches.invalidate()
    cos = quax.quaxify(jnp.cos)
    try:
        for _ in range(2):  # the second call compiles the program
            out = cos(Drifting(X)).array
            np.testing.assert_allclose(out, np.cos(np.asarray(X)), rtol=1e-6)
        _drift[0] = 2.0
        # A fresh rule run, not a replay of the first: what verify mode checks
        # here is the eager program.
        quax_replay._recordings.clear()
        with pytest.raises(
            quax.CacheMismatchError, match="its staged program or its outputs"
        ):
            cos(Drifting(X))
    finally:
        _drift[0] = 1.0
        quax._foundation._caches.invalidate()


def test_verify_mode_drops_what_an_inlined_jit_was_recorded_with_when_it_dies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In verify mode, what a recording of an inlined `jit` was made with is kept
    while its jaxpr lives, and dropped with it, as the recording is (mutant
    `_replay_or_run` 156 kept it for good, past its jaxpr: under a key holding the
    dead jaxpr's `id`, which a later jaxpr may reuse)."""
    caches = quax._foundation._caches
    monkeypatch.setattr(caches, "verifying", True)
    caches.invalidate()
    made = caches._made

    def of_inlined_jits() -> set[Any]:
        # An inlined `jit`'s recording is keyed by its jaxpr's `id`; a primitive's
        # by the primitive and its params.
        return {
            k
            for k in made._data
            if k[0] == quax_replay._recordings.name and type(k[1][0]) is int
        }

    def run() -> None:
        # A fresh function: JAX's caches hold its jaxpr only while it lives.
        triple = jax.jit(lambda v: v * 3.0, inline=True)
        out = jax.jit(quax.quaxify(triple))(Dense(X))
        np.testing.assert_array_equal(out.array, 3.0 * np.asarray(X))
        assert of_inlined_jits()

    try:
        run()
        gc.collect()
        len(made)  # drops the entries whose code died
        assert not of_inlined_jits()
    finally:
        caches.invalidate()


# Each run of `AsksAbout`'s rule, and what `known_constant` told it.
_asked: list[str] = []


class AsksAbout(Dense):
    """A `Dense` whose sum with a plain array asks `known_constant` about it."""


@quax.register(lax.add_p)
def _(x: AsksAbout, y: ArrayLike) -> AsksAbout:
    _asked.append("run")
    known = quax.known_constant(y, 1 << 20)
    _asked.append("unknown" if known is None else "known")
    return AsksAbout(x.array + y)


@pytest.mark.caching_behaviour
def test_a_nested_jit_remembers_which_large_arguments_its_rules_ask_about() -> None:
    """A concrete array above `MAX_CONSTANT_SIZE` passed to a nested `jit` goes in
    by its aval; where a rule asks `known_constant` about it, the body runs again
    with it as a constant, and the `jit` remembers that: on later calls, the body
    is keyed by that argument's value at once, never traced by its aval first
    (mutant `call_body` 51 never read what it remembered, and every call with a new
    array ran the rule twice, the first run stopped by the question)."""
    add = quax.quaxify(jax.jit(lambda p, c: p + c))
    p = AsksAbout(jnp.arange(100, dtype=jnp.float32))
    _asked.clear()
    for fill in (1.0, 2.0, 3.0):
        c = np.full(100, fill, np.float32)
        out = add(p, c)
        np.testing.assert_array_equal(out.array, np.arange(100, dtype=np.float32) + c)
    # The first call's first run was stopped by the question (no answer recorded).
    assert _asked == ["run", "run", "known", "run", "known", "run", "known"]


# Each run of `MakesLists`'s rule: its number.
_list_runs: list[int] = []


class Listed(Dense):
    """A `Dense` with a static field that cannot be hashed: a list."""

    runs: list[int] = eqx.field(static=True)


class MakesLists(Dense):
    """A `Dense` whose exponential is a `Listed` holding a new list on each run of
    its rule: the run's number."""


@quax.register(lax.exp_p)
def _(x: MakesLists) -> Listed:
    _list_runs.append(len(_list_runs) + 1)
    return Listed(lax.exp(x.array), [_list_runs[-1]])


def test_an_output_field_that_cannot_be_hashed_is_never_replayed_unchecked() -> None:
    """A rule whose output holds a static field it made that cannot be hashed (a
    list, no input's) is not replayed on its first run's word: the next run must
    give an equal one, and here each run gives its own, so every bind of the same
    key in one program runs the rule, and each output holds its own run's list, as
    without `jit` (mutant `_kept_statics` 13 took such a field for one every run
    gives: the second and third binds replayed the first's list, `[1]`)."""
    exp = quax.quaxify(lax.exp)
    seen: list[list[int]] = []

    def f(x: jax.Array) -> list[jax.Array]:
        outs = [exp(MakesLists(x)) for _ in range(3)]
        seen.extend(o.runs for o in outs)
        return [o.array for o in outs]

    _list_runs.clear()
    got = jax.jit(f)(X)
    assert seen == [[1], [2], [3]]
    for g in got:
        np.testing.assert_allclose(g, np.exp(np.asarray(X)), rtol=1e-6)


# The number each run of `CallsHost`'s rule adds through a host callback.
_host_runs: list[float] = []


class CallsHost(Dense):
    """A `Dense` whose logarithm adds, in a host callback, its rule's run number."""


@quax.register(lax.log_p)
def _(x: CallsHost) -> CallsHost:
    _host_runs.append(float(len(_host_runs) + 1))
    n = np.float32(_host_runs[-1])
    shape = jax.ShapeDtypeStruct(x.array.shape, x.array.dtype)
    added = jax.pure_callback(lambda a: a + n, shape, x.array, vmap_method="sequential")
    return CallsHost(lax.log(added))


def test_a_rule_staging_a_host_callback_is_run_again_not_replayed() -> None:
    """A rule that stages a host callback (a `pure_callback`, which has no effect
    and no sub-jaxpr) is run on every bind of the same key in one program: host
    code is its own each time, and each bind's callback adds its own run's number,
    as without `jit` (mutant `_record` 60 kept the recording where the callback
    did not call a jaxpr, and replayed the first run's callback: `+ 1` three
    times)."""
    log = quax.quaxify(lax.log)

    def f(x: jax.Array) -> list[jax.Array]:
        return [log(CallsHost(x)).array for _ in range(3)]

    _host_runs.clear()
    x = jnp.array([0.5, 1.5, 2.25, 3.0])
    got = jax.jit(f)(x)
    assert _host_runs == [1.0, 2.0, 3.0]
    for n, g in zip(_host_runs, got, strict=True):
        np.testing.assert_allclose(g, np.log(np.asarray(x) + n), rtol=1e-6)


@pytest.mark.caching_behaviour
def test_an_inlined_jits_recording_is_dropped_when_its_jaxpr_dies() -> None:
    """The recording of an inlined `jit` is kept under its jaxpr's `id` while the
    jaxpr lives, and dropped with it: a later jaxpr may reuse the `id` (mutant
    `_replay_or_run` 148 put it without the jaxpr, and kept it for good)."""

    def of_inlined_jits() -> list[Any]:
        # An inlined `jit`'s key starts with its jaxpr's `id`; a primitive's with
        # the primitive and its params.
        return [k for k in quax_replay._recordings._data if type(k[0]) is int]

    def run() -> None:
        # A fresh function: JAX's caches hold its jaxpr only while it lives.
        triple = jax.jit(lambda v: v * 3.0, inline=True)
        out = jax.jit(quax.quaxify(triple))(Dense(X))
        np.testing.assert_array_equal(out.array, 3.0 * np.asarray(X))
        assert of_inlined_jits()

    run()
    gc.collect()
    len(quax_replay._recordings)  # drops the entries whose code died
    assert not of_inlined_jits()
