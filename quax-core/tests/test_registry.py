"""The rule registry: redefinition versus conflicts, params a rule does not declare,
rules without annotations, argument checks of `quax.register`/`quax.resolve`, and
the version clients gate on."""

import importlib.util
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
import pytest
import quax
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jaxtyping import ArrayLike
from packaging.version import Version


class Tagged(quax.ArrayValue):
    """A plain array in a wrapper; refuses to materialise."""

    array: jax.Array

    def aval(self) -> jax.core.ShapedArray:
        return jax.core.ShapedArray(self.array.shape, self.array.dtype)

    def materialise(self) -> Any:
        raise RuntimeError("Refusing to materialise Tagged")


def _line_of(function: Any) -> str:
    return f"{Path(__file__).name}:{function.__code__.co_firstlineno}"


# Redefinition and conflicts -----------------------------------------------------------


class Redefined(Tagged):
    pass


def test_redefinition_in_one_module_replaces_silently() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @quax.register(lax.neg_p)
        def _(x: Redefined, **params: Any) -> Any:
            return Redefined(x.array + 100.0)

        @quax.register(lax.neg_p)
        def _(x: Redefined, **params: Any) -> Any:
            return Redefined(x.array + 200.0)

    out = quax.quaxify(jnp.negative)(Redefined(jnp.array([1.0, 2.0])))
    np.testing.assert_array_equal(out.array, [201.0, 202.0])


class Rerun(Tagged):
    pass


def test_module_executed_again_replaces_silently(tmp_path: Path) -> None:
    # A module whose import failed is executed again on the next import (as unxt's
    # rules module is under warnings-as-errors): its rules, over types defined
    # elsewhere, are registered a second time.
    source = tmp_path / "c2_rerun_module.py"
    source.write_text(
        textwrap.dedent(
            """
            import quax
            from jax import lax

            @quax.register(lax.cos_p)
            def _(x: Target, **params):
                return OFFSET
            """
        )
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for offset in (1.0, 2.0):
            spec = importlib.util.spec_from_file_location("c2_rerun_module", source)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            module.Target = Rerun  # type: ignore[attr-defined]
            module.OFFSET = offset  # type: ignore[attr-defined]
            spec.loader.exec_module(module)
    rule = quax.resolve(lax.cos_p, [Rerun]).function
    assert rule is not None and rule(None) == 2.0


class Contested(Tagged):
    pass


def _rule_from(package: str, result: float, cls: type[Tagged] = Contested) -> Any:
    """A rule for `exp` on `cls` that fills with `result`, as if registered by the
    distribution providing `package`."""

    def rule(x: cls, **params: Any) -> Any:  # type: ignore[valid-type]
        return cls(jnp.full_like(x.array, result))

    rule.__module__ = f"{package}._rules"
    return rule


def test_two_distributions_registering_one_signature_warn() -> None:
    first, second = _rule_from("quax_lora", 1.0), _rule_from("quax_units", 2.0)
    quax.register(lax.exp_p)(first)
    with pytest.warns(quax.RuleConflictWarning) as caught:
        quax.register(lax.exp_p, precedence=1)(second)
    (message,) = [str(w.message) for w in caught]
    assert "primitive `exp`" in message
    assert "quax-lora (quax_lora._rules." in message
    assert "quax-units (quax_units._rules." in message
    assert "wins by its higher precedence" in message
    out = quax.quaxify(jnp.exp)(Contested(jnp.zeros(2)))
    np.testing.assert_array_equal(out.array, [2.0, 2.0])


# Equal signatures from two distributions never both reach plum: one replaces the
# other at registration, by precedence, and on a tie the later one wins (as the
# docstring of `quax.register` and the warning say). Each case registers on a type
# of its own, so that no earlier registration takes part.


@pytest.mark.parametrize(
    ("first", "second"), [("quax_lora", "quax_units"), ("quax_units", "quax_lora")]
)
def test_precedence_tie_between_two_distributions_goes_to_the_later(
    first: str, second: str
) -> None:
    class Tied(Tagged):
        pass

    quax.register(lax.exp_p)(_rule_from(first, 1.0, Tied))
    with pytest.warns(quax.RuleConflictWarning, match="so the later one, .* wins"):
        quax.register(lax.exp_p)(_rule_from(second, 2.0, Tied))
    out = quax.quaxify(jnp.exp)(Tied(jnp.zeros(2)))
    np.testing.assert_array_equal(out.array, [2.0, 2.0])
    rule = quax.resolve(lax.exp_p, [Tied]).function
    assert rule is not None and rule.__module__ == f"{second}._rules"


def test_higher_precedence_of_the_earlier_distribution_is_kept() -> None:
    class Kept(Tagged):
        pass

    quax.register(lax.exp_p, precedence=1)(_rule_from("quax_units", 1.0, Kept))
    with pytest.warns(quax.RuleConflictWarning) as caught:
        quax.register(lax.exp_p)(_rule_from("quax_lora", 2.0, Kept))
    (message,) = [str(w.message) for w in caught]
    winner = r"; quax-units \(quax_units\._rules\.[^;]*\) wins by its higher precedence"
    assert re.search(winner, message), message
    out = quax.quaxify(jnp.exp)(Kept(jnp.zeros(2)))
    np.testing.assert_array_equal(out.array, [1.0, 1.0])


# Params a rule does not declare -------------------------------------------------------


def _make_primitive() -> Primitive:
    """A primitive with one param, `shift`, added after rules were written
    without it: `None` (its neutral value) adds nothing."""
    primitive = Primitive("c2_shifted")
    primitive.def_abstract_eval(lambda x, *, shift: x)
    primitive.def_impl(lambda x, *, shift: x + (0.0 if shift is None else shift))

    def lowering(ctx: Any, x: Any, *, shift: Any) -> Any:
        fn = lambda y: y + (0.0 if shift is None else shift)
        return mlir.lower_fun(fn, multiple_results=False)(ctx, x)

    mlir.register_lowering(primitive, lowering)
    return primitive


shifted_p = _make_primitive()


class Old(Tagged):
    pass


@quax.register(shifted_p)
def _old_rule(x: Old) -> Old:
    return Old(x.array * 10.0)


def test_undeclared_param_at_its_neutral_value_is_dropped() -> None:
    out = quax.quaxify(lambda x: shifted_p.bind(x, shift=None))(Old(jnp.ones(2)))
    np.testing.assert_array_equal(out.array, [10.0, 10.0])


def test_undeclared_param_with_another_value_names_rule_param_and_fix() -> None:
    with pytest.raises(TypeError) as e:
        quax.quaxify(lambda x: shifted_p.bind(x, shift=3.0))(Old(jnp.ones(2)))
    message = str(e.value)
    assert "primitive `c2_shifted`" in message
    assert "param `shift`" in message and "shift=3.0" in message
    assert _line_of(_old_rule) in message
    assert "Add `**params`" in message


def test_declared_param_is_passed() -> None:
    class Declares(Tagged):
        pass

    @quax.register(shifted_p)
    def _(x: Declares, *, shift: Any) -> Declares:
        return Declares(x.array + shift)

    out = quax.quaxify(lambda x: shifted_p.bind(x, shift=3.0))(Declares(jnp.ones(2)))
    np.testing.assert_array_equal(out.array, [4.0, 4.0])


class Mul(Tagged):
    pass


@quax.register(lax.mul_p)
def _(x: Mul, y: Mul) -> Mul:  # as the published tutorials write it
    return Mul(x.array * y.array)


def test_rule_without_params_for_mul_runs_on_jax_0_10() -> None:
    # JAX 0.10 binds `mul` with `out_dtype=None`.
    x = Mul(jnp.array([1.0, 2.0, 3.0]))
    out = quax.quaxify(lambda a, b: a * b)(x, x)
    np.testing.assert_array_equal(out.array, [1.0, 4.0, 9.0])
    out = jax.jit(quax.quaxify(lambda a, b: a * b))(x, x)
    np.testing.assert_array_equal(out.array, [1.0, 4.0, 9.0])


class TopK(Tagged):
    pass


@quax.register(lax.top_k_p)
def _top_k_rule(operand: TopK, *, k: int) -> list[Any]:
    values, indices = lax.top_k(operand.array, k)
    return [TopK(values), indices]


def test_top_k_axis_neutral_when_last() -> None:
    x = TopK(jnp.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]]))
    for axis in (-1, 1):
        top_2 = lambda a, axis=axis: lax.top_k(a, 2, axis=axis)
        values, indices = quax.quaxify(top_2)(x)
        np.testing.assert_array_equal(values.array, [[3.0, 2.0], [5.0, 4.0]])
        np.testing.assert_array_equal(indices, [[0, 2], [1, 2]])


def test_top_k_other_axis_is_refused() -> None:
    x = TopK(jnp.array([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]]))
    with pytest.raises(TypeError, match=r"`top_k`.*param `axis`.*axis=0") as e:
        quax.quaxify(lambda a: lax.top_k(a, 1, axis=0))(x)
    assert _line_of(_top_k_rule) in str(e.value)
    assert "-1, the last axis" in str(e.value)


# Argument checks ----------------------------------------------------------------------


@pytest.mark.parametrize("not_a_primitive", [jnp.add, lax.add, "add_p", None])
def test_register_expects_a_primitive(not_a_primitive: Any) -> None:
    with pytest.raises(TypeError, match=r"expects a JAX primitive.*jax\.lax\.add_p"):
        quax.register(not_a_primitive)


def test_register_elementwise_expects_primitives() -> None:
    with pytest.raises(TypeError, match=r"collection of primitives.*`sin`"):
        quax.register_elementwise(lax.sin_p)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects a JAX primitive"):
        quax.register_elementwise([lax.sin_p, jnp.cos])  # pyright: ignore[reportArgumentType]  (deliberately wrong)


# Rules without annotations ------------------------------------------------------------


def _doubling_primitive(name: str) -> Primitive:
    """A fresh primitive (so that a catch-all rule for it reaches no other test):
    `x -> 2 * x`, with its index-like first operand ignored when there are two."""
    primitive = Primitive(name)
    primitive.def_impl(lambda *xs, **params: 2 * xs[-1])
    primitive.def_abstract_eval(lambda *xs, **params: xs[-1])
    return primitive


class Own(Tagged):
    pass


class Annotated(Tagged):
    pass


def test_rule_without_annotations_is_a_silent_catch_all_for_own_types() -> None:
    # quaxed's test wrapper registers `def cond_p(index, consts)`, with its value
    # type in the same package: accepted, and silent on its own types.
    caught_p = _doubling_primitive("c5_caught")

    def unannotated(x, **params):
        return Own(x.array + 1.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quax.register(caught_p)(unannotated) is unannotated
        out = quax.quaxify(caught_p.bind)(Own(jnp.array([1.0, 2.0])))
    assert isinstance(out, Own)
    np.testing.assert_array_equal(out.array, [2.0, 3.0])
    resolution = quax.resolve(caught_p, [Own])
    assert resolution.kind == "rule" and resolution.function is unannotated
    assert resolution.reason.endswith(f"{_line_of(unannotated)}, without annotations")


def test_annotated_rule_wins_over_a_catch_all() -> None:
    caught_p = _doubling_primitive("c5_outranked")

    def unannotated(x, **params):
        raise AssertionError("the annotated rule wins")

    unannotated.__module__ = "someone_else._rules"
    quax.register(caught_p)(unannotated)

    @quax.register(caught_p)
    def annotated(x: Annotated, **params: Any) -> Annotated:
        return Annotated(x.array * 10.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = quax.quaxify(caught_p.bind)(Annotated(jnp.array([1.0, 2.0])))
    np.testing.assert_array_equal(out.array, [10.0, 20.0])
    assert quax.resolve(caught_p, [Annotated]).function is annotated


def test_annotated_varargs_rule_wins_over_a_catch_all_of_fixed_arity() -> None:
    # As the core's `cond` rule `(index, *operands)` against quaxed's catch-all
    # `(index, consts)`: plum alone would call the two ambiguous.
    branch_p = _doubling_primitive("c5_branch")

    @quax.register(branch_p)
    def annotated(index: ArrayLike, *ops: Tagged | ArrayLike, **params: Any) -> Any:
        (operand,) = ops
        assert isinstance(operand, Own)
        return Own(operand.array * 10.0)

    def unannotated(index, consts):
        raise AssertionError("the annotated rule wins")

    quax.register(branch_p)(unannotated)
    out = quax.quaxify(branch_p.bind)(jnp.array(0), Own(jnp.array([1.0, 2.0])))
    np.testing.assert_array_equal(out.array, [10.0, 20.0])
    assert quax.resolve(branch_p, [jax.Array, Own]).function is annotated


def test_catch_all_warns_when_it_catches_another_distributions_type() -> None:
    caught_p = _doubling_primitive("c5_foreign")

    def unannotated(x, **params):
        return Tagged(x.array * 3.0)

    unannotated.__module__ = "someone_else._rules"
    quax.register(caught_p)(unannotated)
    tagged = re.escape(f"`{__name__}.Tagged`")
    with pytest.warns(
        quax.RuleConflictWarning,
        match=rf"(?s)primitive `c5_foreign` annotates none.*{tagged}"
        r".*\(someone_else\).*Annotate the inputs",
    ) as caught:
        out = quax.quaxify(caught_p.bind)(Tagged(jnp.array([1.0, 2.0])))
    assert _line_of(unannotated) in str(caught[0].message)
    # A warning, not a refusal: the rule's result stands.
    np.testing.assert_array_equal(out.array, [3.0, 6.0])


def test_register_refuses_a_non_callable() -> None:
    with pytest.raises(TypeError, match="decorates a function"):
        quax.register(lax.sin_p)(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("values", ["hello", ["hello"], [str], 3, [Tagged, None]])
def test_resolve_rejects_non_types(values: Any) -> None:
    with pytest.raises(TypeError, match=r"quax\.resolve expects"):
        quax.resolve(lax.mul_p, values)


def test_resolve_rejects_a_non_primitive() -> None:
    with pytest.raises(TypeError, match=r"quax.resolve expects a JAX primitive"):
        quax.resolve("hello", [Tagged])  # type: ignore[arg-type]


def test_resolve_accepts_types_values_and_a_mix() -> None:
    x, y = Mul(jnp.ones(2)), Mul(jnp.ones(2))
    for values in ([Mul, Mul], [x, y], [Mul, y]):
        resolution = quax.resolve(lax.mul_p, values)
        assert resolution.kind == "rule"
        assert Path(__file__).name in resolution.reason
    assert quax.resolve(lax.sin_p, [Tagged]).kind == "materialise"
    assert quax.resolve(lax.add_p, [Tagged, np.float32]).kind == "materialise"


def test_resolution_names_rule_file_and_line() -> None:
    reason = quax.resolve(lax.top_k_p, [TopK]).reason
    assert reason.startswith(f"registered rule {__name__}._top_k_rule at ")
    assert reason.endswith(_line_of(_top_k_rule))


# Version ------------------------------------------------------------------------------


def test_version_compares_as_the_published_api() -> None:
    # Clients gate on it, e.g. quaxed's `Version(quax.__version__) >= Version("0.4")`.
    assert Version(quax.__version__) >= Version("0.4.6")
    assert Version(quax.__version__) >= Version("0.4")


def test_plain_arraylike_rules_still_dispatch() -> None:
    class Scaled(Tagged):
        pass

    @quax.register(lax.mul_p)
    def _(x: Scaled, y: ArrayLike) -> Scaled:
        return Scaled(x.array * y)

    out = quax.quaxify(lambda a: a * 3.0)(Scaled(jnp.array([1.0, 2.0])))
    np.testing.assert_array_equal(out.array, [3.0, 6.0])
