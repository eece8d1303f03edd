"""The conformance kit `quax.testing`: it passes on correct rules and fails, naming
the check, on planted wrong ones."""

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax.testing as qt
import quax.testing._hlo as quax_hlo
from hypothesis import given, settings, strategies as st
from jax import lax
from quax.testing import strategies as qst


class Wrapped(quax.ArrayValue):
    """An array in a wrapper that every floating-point result keeps (unwrap, bind,
    rewrap)."""

    array: jax.Array
    linear_in_leaves: ClassVar[bool] = True

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        return self.array

    @staticmethod
    def default(primitive: Any, values: Sequence[Any], params: dict[str, Any]) -> Any:
        cls = next(type(v) for v in values if isinstance(v, Wrapped))
        arrays = [v.array if isinstance(v, Wrapped) else v for v in values]
        out = primitive.bind(*arrays, **params)
        # Comparisons and integer results come back plain, as a family's would.
        wrap = lambda o: cls(o) if jnp.issubdtype(o.dtype, jnp.inexact) else o
        if primitive.multiple_results:
            return [wrap(o) for o in out]
        return wrap(out)


class Plain(quax.ArrayValue):
    """An array with no rules at all: every primitive materialises it."""

    array: jax.Array

    def aval(self) -> Any:
        return jax.typeof(self.array)

    def materialise(self) -> jax.Array:
        return self.array


class Gated(Plain):
    """Refuses to materialise unless enabled, as the published quax's types do."""

    allowed: bool = False

    def enable_materialise(self, allow: bool = True) -> "Gated":
        return Gated(self.array, allow)

    def materialise(self) -> jax.Array:
        if not self.allowed:
            raise RuntimeError("Refusing to materialise a Gated")
        return self.array


class WrongCos(Wrapped):
    pass


@quax.register(lax.cos_p)
def _(x: WrongCos, **params: Any) -> WrongCos:
    del params
    return WrongCos(jnp.sin(x.array))  # a planted wrong value


class WrongGrad(Wrapped):
    pass


@quax.register(lax.sin_p)
def _(x: WrongGrad, **params: Any) -> WrongGrad:
    del params
    return WrongGrad(jnp.sin(lax.stop_gradient(x.array)))  # right value, no gradient


class WrongAxes(Wrapped):
    pass


@quax.register(lax.reduce_sum_p)
def _(x: WrongAxes, *, axes: Any, **params: Any) -> WrongAxes:
    del axes, params
    return WrongAxes(jnp.sum(x.array))  # right only when summing every axis


class Pair(quax.ArrayValue):
    """`a + b` with the dense shape as static metadata: its stacked leaves do not
    form a batched `Pair`."""

    a: jax.Array
    b: jax.Array
    shape_: tuple[int, ...] = eqx.field(static=True)
    linear_in_leaves: ClassVar[bool] = True

    def aval(self) -> Any:
        return jax.core.ShapedArray(self.shape_, self.a.dtype)

    def materialise(self) -> jax.Array:
        return self.a + self.b


@quax.register(lax.mul_p)
def _(x: Pair, y: jax.Array | float, **params: Any) -> Pair:
    del params
    return Pair(x.a * y, x.b * y, x.shape_)


X = jnp.arange(6.0).reshape(2, 3) / 6
Y = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)


def test_passes_on_correct_rules():
    report = qt.assert_matches_dense(
        lambda a, b: jnp.tanh(a) @ b + 1, Wrapped(X), Y, out_types=Wrapped
    )
    assert report.checks == {
        name: "passed"
        for name in ("eval", "jit", "vmap(quaxify)", "quaxify(vmap)", "grad", "jvp")
    }
    assert report.out_types == [Wrapped]
    assert "output types: Wrapped" in str(report)


def test_pytree_outputs_and_integer_leaves():
    def fn(a, i):
        return {"sum": jnp.sum(a, axis=0), "index": jnp.argmax(a, axis=1) + i}

    report = qt.assert_matches_dense(fn, Wrapped(X), jnp.array([1, 2]))
    assert report.checks["grad"] == "passed"


def test_wrong_value_fails():
    with pytest.raises(AssertionError, match=r"\[eval\] output leaf <root> differs"):
        qt.assert_matches_dense(jnp.cos, WrongCos(X))


def test_wrong_gradient_fails():
    # Values are right: jit and vmap, which pass, are left out.
    with pytest.raises(AssertionError, match=r"\[grad\] gradient leaf .* differs"):
        qt.assert_matches_dense(jnp.sin, WrongGrad(X), jit=False, vmap=False)
    with pytest.raises(AssertionError, match=r"\[jvp\] output tangent"):
        qt.assert_matches_dense(
            jnp.sin, WrongGrad(X), jit=False, vmap=False, grad=False
        )


def test_wrong_batching_fails():
    # Right unbatched; under `quaxify(vmap(...))` the rule sees the batch axis.
    qt.assert_matches_dense(jnp.sum, WrongAxes(X), vmap=False, jvp=False)
    with pytest.raises(AssertionError, match=r"\[quaxify\(vmap\)\]"):
        qt.assert_matches_dense(jnp.sum, WrongAxes(X), jit=False)


def test_eval_check_can_be_skipped():
    report = qt.assert_matches_dense(
        lambda a, b: jnp.tanh(a) @ b, Wrapped(X), Y, eval=False, out_types=Wrapped
    )
    assert report.checks.pop("eval") == "skipped: eval=False"
    assert set(report.checks.values()) == {"passed"} and len(report.checks) == 5
    assert report.out_types == [Wrapped]
    # The jit check still compares values, types and materialisations.
    with pytest.raises(AssertionError, match=r"\[jit\] output leaf <root> differs"):
        qt.assert_matches_dense(jnp.cos, WrongCos(X), eval=False)
    with pytest.raises(AssertionError, match=r"\[jit\] output leaf 0 is Wrapped,"):
        qt.assert_matches_dense(jnp.sin, Wrapped(X), eval=False, out_types=Plain)
    with pytest.raises(AssertionError, match=r"(?s)\[jit\] .*materialised.*sin"):
        qt.assert_matches_dense(jnp.sin, Plain(X), eval=False)
    with pytest.raises(ValueError, match=r"needs `eval=True` or `jit=True`"):
        qt.assert_matches_dense(jnp.sin, Wrapped(X), eval=False, jit=False)
    # Non-array arguments (a function, a Python number) stay static.
    report = qt.assert_matches_dense(
        lambda f, a, s: f(a) * s, jnp.sin, Wrapped(X), 2.0, eval=False, jvp=False
    )
    assert report.checks["quaxify(vmap)"] == "passed"


def test_without_eval_nothing_runs_op_by_op():
    traced = []

    def fn(a):
        traced.append(isinstance(a, jax.core.Tracer))
        return jnp.sin(a)

    qt.assert_matches_dense(fn, Wrapped(X), eval=False, grad=False)
    assert traced and all(traced)
    traced.clear()
    qt.assert_matches_dense(fn, Wrapped(X), jit=False, vmap=False, grad=False)
    assert not all(traced)  # the eval check's dense reference runs op by op


def test_materialising_rule_fails():
    with pytest.raises(
        AssertionError, match=r"(?s)\[eval\] .*materialised.*sin, Plain: 1"
    ):
        qt.assert_matches_dense(jnp.sin, Plain(X))
    report = qt.assert_matches_dense(
        jnp.sin, Plain(X), allow_materialise=True, vmap=False, jvp=False
    )
    assert len(report.out_types) == 1 and issubclass(report.out_types[0], jax.Array)


def test_refusal_inside_quaxify_fails_naming_the_check():
    # `Gated` densifies for the reference (enable_materialise) but not inside.
    with pytest.raises(AssertionError, match=r"\[eval\] .*RuntimeError.*Refusing"):
        qt.assert_matches_dense(jnp.sin, Gated(X))
    assert qt.densify(Gated(X)) is X


class Stubborn(Wrapped):
    """Keeps its type and refuses to materialise, without `enable_materialise`."""

    def materialise(self) -> jax.Array:
        raise RuntimeError("Refusing to materialise a Stubborn")


def test_undensifiable_values_fail_with_the_way_out():
    with pytest.raises(AssertionError, match=r"(?s)\[eval\] .*arguments.*densify="):
        qt.assert_matches_dense(jnp.sin, Stubborn(X))
    # A `densify=` that knows the type.
    unwrap = lambda t: jax.tree.map(
        lambda v: v.array if isinstance(v, Wrapped) else v,
        t,
        is_leaf=lambda v: isinstance(v, Wrapped),
    )
    report = qt.assert_matches_dense(
        jnp.sin, Stubborn(X), densify=unwrap, vmap=False, jvp=False
    )
    assert report.out_types == [Stubborn]


def test_out_types():
    with pytest.raises(
        AssertionError, match=r"output leaf 0 is array float32\[2,3\], expected Pair"
    ):
        qt.assert_matches_dense(
            jnp.sin, Plain(X), allow_materialise=True, out_types=Pair
        )
    with pytest.raises(AssertionError, match="out_types names 2 output leaves"):
        qt.assert_matches_dense(jnp.sin, Wrapped(X), out_types=[Wrapped, Wrapped])
    qt.assert_matches_dense(
        lambda a: (a, jnp.argmax(a)),
        Wrapped(X),
        out_types=[Wrapped, (Wrapped, jax.Array)],
        vmap=False,
        grad=False,
        jvp=False,
    )


def test_static_shape_skips_quaxify_of_vmap_with_reason():
    report = qt.assert_matches_dense(
        lambda p: p * 2.0, Pair(X, X, X.shape), jit=False, grad=False, jvp=False
    )
    assert report.checks["vmap(quaxify)"] == "passed"
    assert report.checks["quaxify(vmap)"].startswith("skipped: stacking the leaves")


def test_leafless_value_skips_vmap_and_derivatives():
    report = qt.assert_matches_dense(
        lambda z: z + 1, quax.zero.Zero((2, 3), jnp.float32)
    )
    assert report.checks["vmap"].startswith("skipped: no argument has an array leaf")
    assert report.checks["grad"].startswith("skipped: no argument has a floating")


def test_tolerance():
    # float32 at 1e-4 on an accelerator (`test_tolerance_follows_the_backend`).
    single = 1e-5 if jax.default_backend() == "cpu" else 1e-4
    assert qt.tolerance(jnp.float32) == dict(rtol=single, atol=single)
    assert qt.tolerance(jnp.float64) == dict(rtol=1e-10, atol=1e-10)
    assert qt.tolerance(jnp.bfloat16)["rtol"] >= 1e-2
    assert qt.tolerance(jnp.int32) == dict(rtol=0.0, atol=0.0)
    # Within tolerance passes; a custom tolerance is honoured.
    near = lambda a: a * (1 + 3e-6)
    qt.assert_matches_dense(lambda a: a, Wrapped(near(X)), vmap=False, grad=False)
    with pytest.raises(AssertionError, match="max abs error"):
        qt.assert_matches_dense(jnp.cos, WrongCos(X), rtol=1e-1, atol=1e-1)


def test_tolerance_follows_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # A TPU's float32 `log(exp(1.0))` is 0.999988: float32 results compared with
    # another program's are judged at 1e-4 there, 1e-5 on a CPU; the other dtypes
    # alike everywhere.
    cpu = {"rtol": 1e-5, "atol": 1e-5}
    accelerator = {"rtol": 1e-4, "atol": 1e-4}
    for backend, expected in [("cpu", cpu), ("tpu", accelerator), ("gpu", accelerator)]:
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        assert qt.tolerance(jnp.float32) == expected
        assert qt.tolerance(jnp.complex64) == expected
        assert qt.tolerance(jnp.bfloat16) == {"rtol": 1.6e-2, "atol": 1.6e-2}
        assert qt.tolerance(jnp.float64) == {"rtol": 1e-10, "atol": 1e-10}
        assert qt.tolerance(jnp.int8) == {"rtol": 0.0, "atol": 0.0}


def _dot(a, b):
    return a @ b


def test_compiled_hlo_and_assert_hlo_lacks():
    # XLA's TPU compiler rewrites every `dot` as a `convolution`.
    product = "convolution" if jax.default_backend() == "tpu" else "dot"
    hlo = qt.compiled_hlo(_dot, Wrapped(X), Y)
    assert ("f32", (2, 4)) in qt.hlo_shapes(hlo)
    assert product in qt.hlo_ops(hlo)
    qt.assert_hlo_lacks(_dot, Wrapped(X), Y, shapes=[(4, 4)], ops=["sort"])
    with pytest.raises(AssertionError, match=rf"array f32\[2, 4\]: .*{product}"):
        qt.assert_hlo_lacks(_dot, Wrapped(X), Y, shapes=[(2, 4)])
    with pytest.raises(AssertionError, match=f"op {product}"):
        qt.assert_hlo_lacks(_dot, Wrapped(X), Y, ops=["dot"])
    with pytest.raises(AssertionError, match=r"array f32\[3, 4\]: .*parameter"):
        qt.assert_hlo_lacks(_dot, Wrapped(X), Y, shapes=[(3, 4)])
    qt.assert_hlo_lacks(_dot, Wrapped(X), Y, shapes=[(3, 4)], ignore_parameters=True)
    # Restricted to another dtype, the shape is allowed.
    qt.assert_hlo_lacks(_dot, Wrapped(X), Y, shapes=[(2, 4)], dtypes=[jnp.int32])


def test_assert_hlo_lacks_reads_a_programs_text():
    # A program that is not `jax.jit(quaxify(fn))` is checked by its compiled text:
    # the same findings as from the function, the backend's rewrites included.
    product = "convolution" if jax.default_backend() == "tpu" else "dot"
    hlo = jax.jit(_dot).lower(X, Y).compile().as_text()
    assert hlo is not None
    qt.assert_hlo_lacks(hlo, shapes=[(4, 4)], ops=["sort"])
    with pytest.raises(AssertionError, match=rf"array f32\[2, 4\]: .*{product}"):
        qt.assert_hlo_lacks(hlo, shapes=[(2, 4)])
    with pytest.raises(AssertionError, match=f"op {product}"):
        qt.assert_hlo_lacks(hlo, ops=["dot"])
    with pytest.raises(AssertionError, match=r"array f32\[3, 4\]: .*parameter"):
        qt.assert_hlo_lacks(hlo, shapes=[(3, 4)])
    qt.assert_hlo_lacks(hlo, shapes=[(3, 4)], ignore_parameters=True)
    with pytest.raises(TypeError, match="no arguments after a program's HLO text"):
        qt.assert_hlo_lacks(hlo, X, shapes=[(3, 4)])


def test_forbidding_an_op_forbids_what_the_backend_rewrites_it_as(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As on a TPU, where `dot` compiles to `convolution`: a backend whose compiler
    # gives another opcode for a forbidden one is caught by that opcode (here the
    # program's parameters stand in for it, on whatever backend runs the test).
    monkeypatch.setattr(
        quax_hlo, "_REWRITTEN_OPS", {jax.default_backend(): {"sort": "parameter"}}
    )
    with pytest.raises(AssertionError, match="op parameter"):
        qt.assert_hlo_lacks(_dot, Wrapped(X), Y, ops=["sort"])
    qt.assert_hlo_lacks(_dot, Wrapped(X), Y, ops=["reduce-precision"])


def test_hlo_parser_on_fusions_and_tuples():
    hlo = """HloModule m

%fused_computation (p: f32[8,8]) -> f32[8,8] {
  %p = f32[8,8]{1,0} parameter(0)
  ROOT %e = f32[8,8]{1,0} exponential(f32[8,8]{1,0} %p)
}

ENTRY %main (x: f32[8,8]) -> (f32[8,8], s32[]) {
  x = f32[8,8]{1,0} parameter(0)
  f = f32[8,8]{1,0} fusion(x), kind=kLoop, calls=%fused_computation
  c = s32[] constant(3)
  ROOT t = (f32[8,8]{1,0}, s32[]) tuple(f, c)
}
"""
    ops = [(i.name, i.op) for i in qt.hlo_instructions(hlo)]
    assert ops == [
        ("p", "parameter"),
        ("e", "exponential"),
        ("x", "parameter"),
        ("f", "fusion"),
        ("c", "constant"),
        ("t", "tuple"),
    ]
    assert qt.hlo_instructions(hlo)[-1].arrays == (("f32", (8, 8)), ("s32", ()))


# `x @ b` as XLA's TPU compiler gives it (after a TPU v5e's compile, trimmed, with
# more outputs): the input `b` is prefetched into faster memory (`copy-start`,
# `copy-done`) and retiled by a fusion that only bitcasts it; `fusion.4`, `bitcast.2`,
# `add.1` and `fusion.5` compute (3, 4) arrays from the inputs.
_TPU_HLO = (Path(__file__).parent / "fixtures" / "tpu_dot.hlo").read_text()


def test_ignore_parameters_ignores_what_only_moves_them():
    # With `ignore_parameters`, an input's data moved (prefetched, retiled) is not an
    # array the program computes; what computes a (3, 4) array from it still is: the
    # exponential (and its fusion), the add (and its retiling), the flat input seen
    # as (3, 4), and the tuple that holds them.
    lines = quax_hlo._offending(_TPU_HLO, {(3, 4)}, set(), None, True)
    named = [line.split(" = ")[0].split("%")[-1] for line in lines]
    assert named == [
        "exponential.1",
        "fusion.4",
        "bitcast.2",
        "add.1",
        "fusion.5",
        "tuple.1",
    ]
    # Without it, every instruction with a (3, 4) array counts.
    every = quax_hlo._offending(_TPU_HLO, {(3, 4)}, set(), None, False)
    assert len(every) == 14


def test_run_on_simulated_devices():
    out = qt.run_on_simulated_devices(
        """
        import jax
        print(len(jax.devices()), jax.devices()[0].platform)
        """,
        n=4,
    )
    assert out.split() == ["4", "cpu"]
    with pytest.raises(AssertionError, match=r"status 1(.|\n)*ZeroDivisionError"):
        qt.run_on_simulated_devices("print('before'); 1 / 0", n=2)


@settings(max_examples=15, deadline=None)
@given(qst.dot_general_dimension_numbers(), st.data())
def test_dot_general_dimension_numbers(numbers, data):
    lhs_shape, rhs_shape, dims = numbers
    lhs = data.draw(qst.arrays(lhs_shape))
    rhs = data.draw(qst.arrays(rhs_shape))
    out = lax.dot_general(lhs, rhs, dims)
    (lc, rc), (lb, rb) = dims
    # The same contraction with numpy's einsum, from the dimension numbers alone.
    letters = iter("abcdefghijklmnop")
    lhs_sub = [next(letters) for _ in lhs_shape]
    rhs_sub = [next(letters) for _ in rhs_shape]
    for i, j in zip(lc + lb, rc + rb, strict=True):
        rhs_sub[j] = lhs_sub[i]
    free_l = [s for i, s in enumerate(lhs_sub) if i not in lc + lb]
    free_r = [s for j, s in enumerate(rhs_sub) if j not in rc + rb]
    spec = "".join(lhs_sub) + "," + "".join(rhs_sub) + "->"
    spec += "".join([lhs_sub[i] for i in lb] + free_l + free_r)
    expected = np.einsum(spec, np.asarray(lhs), np.asarray(rhs))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=8, deadline=None)
@given(qst.programs(max_ops=3), st.data())
def test_programs_on_a_wrapper(program, data):
    x = data.draw(qst.arrays(program.in_shape, program.dtype))
    assert program(x).shape == program.out_shape
    # jit and vmap are covered above; here the programs' own variety matters.
    report = qt.assert_matches_dense(
        program,
        Wrapped(x),
        out_types=Wrapped,
        jit=False,
        vmap=False,
        grad=program.reverse_mode,
    )
    assert report.checks["jvp"] == "passed"


@settings(max_examples=10, deadline=None)
@given(qst.shapes(1, 2, 2, 3), qst.dtypes(["float", "int", "bool"]), st.data())
def test_shapes_dtypes_arrays(shape, dtype, data):
    x = data.draw(qst.arrays(shape, dtype, min_value=-2, max_value=2))
    assert x.shape == shape and x.dtype == dtype
    assert 1 <= x.ndim <= 2 and all(2 <= s <= 3 for s in shape)
    assert bool(jnp.all(jnp.abs(x.astype(jnp.float32)) <= 2))


def test_strategy_errors():
    with pytest.raises(ValueError, match="unknown dtype kind 'floaty'"):
        qst.dtypes(["floaty"])
    with pytest.raises(ValueError, match=r"unknown ops \['exp'\]"):
        qst.programs(ops=["exp"])


PLUGIN_TESTS = """
import jax.numpy as jnp
import pytest
import quax
from tests.test_testing import Plain, Wrapped, X


def test_kit_fixture(quax_testing):
    quax_testing.assert_matches_dense(jnp.sin, Wrapped(X), vmap=False, grad=False)


@pytest.mark.usefixtures("quax_no_materialisation")
def test_keeps_structure():
    quax.quaxify(jnp.sin)(Wrapped(X))


@pytest.mark.usefixtures("quax_no_materialisation")
def test_materialises():
    quax.quaxify(jnp.sin)(Plain(X))
"""


def test_pytest_plugin(tmp_path):
    # Installed, the `pytest11` entry point loads it; else it is loaded by name.
    (tmp_path / "test_plugin.py").write_text(PLUGIN_TESTS)
    core = Path(__file__).resolve().parents[1]
    installed = {e.name for e in importlib.metadata.entry_points(group="pytest11")}
    # An accelerator machine's JAX warns at import that transparent hugepages are
    # off (its TPU runtime's message, not quax's): that count is not this test's.
    options = ["-q", "-p", "no:cacheprovider"]
    options += ["-W", "ignore:Transparent hugepages:UserWarning"]
    if "quax" not in installed:  # before the entry point is installed (uv sync)
        options += ["-p", "quax.testing._pytest_plugin"]
    # The core's tests before what this process sees (never replacing it: an
    # accelerator machine's JAX is found through `PYTHONPATH`).
    path = os.pathsep.join(p for p in (str(core), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(tmp_path)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=path, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    # The materialising test errors at the fixture's teardown.
    assert "3 passed, 1 error" in result.stdout, result.stdout
    assert "the test materialised quax values" in result.stdout
    assert "sin, Plain: 1" in result.stdout


class _Item:
    """Stands in for a collected pytest item: its markers."""

    def __init__(self, *markers: str) -> None:
        self.markers = [getattr(pytest.mark, m) for m in markers]

    def get_closest_marker(self, name: str) -> Any:
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker: Any) -> None:
        self.markers.append(marker)


@pytest.mark.parametrize("backend, skipped", [("cpu", False), ("tpu", True)])
def test_float64_marker_skips_where_float64_is_not_native(
    monkeypatch: pytest.MonkeyPatch, backend: str, skipped: bool
) -> None:
    import quax.testing._pytest_plugin as plugin

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    double, single = _Item("float64"), _Item()
    plugin.pytest_collection_modifyitems([double, single])  # pyright: ignore[reportArgumentType]
    skip = double.get_closest_marker("skip")
    assert (skip is not None) is skipped
    if skip is not None:
        assert "no native float64" in skip.kwargs["reason"]
    assert single.get_closest_marker("skip") is None
