"""Adapters swapped without recompiling (the compilations counted), and adapters
of mixed ranks in one batch: padded to the largest, or to power-of-two buckets,
each row against its own adapter's dense model in plain JAX."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import pytest
import quax
import quax_lora
from lora_helpers import normal


IN, HIDDEN, OUT = 12, 16, 6


class _Net(eqx.Module):
    """Two linear layers and a tanh: every leaf an array, for `jax.jit`."""

    first: eqx.nn.Linear
    second: eqx.nn.Linear

    def __call__(self, x):
        return self.second(jnp.tanh(self.first(x)))


def _base():
    return _Net(
        eqx.nn.Linear(IN, HIDDEN, key=jr.key(0)),
        eqx.nn.Linear(HIDDEN, OUT, key=jr.key(1)),
    )


def _tuned(seed, rank=4, alpha=8.0, **kwargs):
    """A fine-tuned adapter: `a` and `b` drawn, as training leaves them."""
    model = quax_lora.loraify(
        _base(), rank=rank, alpha=alpha, key=jr.key(seed), **kwargs
    )
    counter = iter(range(100))

    def leaf(x):
        if isinstance(x, quax_lora.LoraArray):
            k = 1000 * seed + next(counter)
            return x.replace(
                a=0.3 * normal(k, x.a.shape), b=0.3 * normal(k + 50, x.b.shape)
            )
        return x

    return jtu.tree_map(leaf, model, is_leaf=quax_lora.is_lora)


X = normal(7, (5, IN))


def _dense(model, xs):
    """The reference: the adapter merged by hand (`w + s a b`) in plain JAX."""

    def leaf(x):
        if isinstance(x, quax_lora.LoraArray):
            return np.asarray(x.w) + x.scaling * np.asarray(x.a) @ np.asarray(x.b)
        return x

    dense = jtu.tree_map(leaf, model, is_leaf=quax_lora.is_lora)
    return jax.vmap(dense)(xs)


class _Counted:
    """A step compiled by `jit` (`jax.jit` or `eqx.filter_jit`), counting its
    traces: a trace is a compilation."""

    def __init__(self, jit):
        self.traces = 0

        def step(model, xs):
            self.traces += 1
            return jax.vmap(quax.quaxify(model))(xs)

        self.step = jit(step)

    def __call__(self, model, xs):
        return self.step(model, xs)


@pytest.mark.parametrize("jit", [jax.jit, eqx.filter_jit])
def test_an_adapter_of_the_same_rank_runs_the_compiled_step(tmp_path, jit):
    step = _Counted(jit)
    first, second = _tuned(1), _tuned(2)
    np.testing.assert_allclose(step(first, X), _dense(first, X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(step(second, X), _dense(second, X), rtol=1e-5, atol=1e-6)
    # Loaded from files into the same loraified model, in both formats.
    quax_lora.save_adapter(tmp_path / "ours", second)
    quax_lora.save_adapter(tmp_path / "peft", second, format="peft")
    for path in (tmp_path / "ours", tmp_path / "peft"):
        loaded = quax_lora.load_adapter(path, first)
        np.testing.assert_allclose(
            step(loaded, X), _dense(second, X), rtol=1e-5, atol=1e-6
        )
    assert step.traces == 1
    if jit is jax.jit:
        assert step.step._cache_size() == 1


def test_alpha_and_dropout_are_static_and_the_serving_form_shares_a_program():
    step = _Counted(jax.jit)
    plain = _tuned(1, alpha=8.0)
    others = [
        _tuned(2, alpha=3.0),
        _tuned(3, alpha=8.0, dropout=0.1),
        _tuned(4, alpha=5.0, variant="rslora"),
    ]
    step(plain, X)
    step(others[0], X)
    assert step.traces == 2  # another alpha, another static field: compiled again
    served = _Counted(jax.jit)
    for model in [plain, *others]:
        got = served(quax_lora.for_serving(model), X)
        np.testing.assert_allclose(got, _dense(model, X), rtol=1e-5, atol=1e-6)
    assert served.traces == 1


def test_stacked_adapters_swapped_and_selected_without_recompiling():
    traces = []

    @jax.jit
    def call(model, xs, index):
        traces.append(1)
        return jax.vmap(
            lambda x, i: quax.quaxify(quax_lora.select_adapter(model, i))(x)
        )(xs, index)

    models = [_tuned(s) for s in range(6)]
    index = jnp.array([0, 2, 1, 2, 0])
    for stack in (models[:3], models[3:]):
        got = call(quax_lora.stack_adapters(stack), X, index)
        for r, i in enumerate(np.asarray(index)):
            np.testing.assert_allclose(
                got[r], _dense(stack[i], X[r : r + 1])[0], rtol=1e-5, atol=1e-6
            )
        call(quax_lora.stack_adapters(stack), X, index[::-1])
    assert len(traces) == 1


def test_select_adapter_by_any_integer_runs_one_program():
    traces = []

    @jax.jit
    def call(model, x):
        traces.append(1)
        return quax.quaxify(model)(x)

    models = [_tuned(s) for s in range(3)]
    stacked = quax_lora.stack_adapters(models)
    # A Python integer is weakly typed; NumPy's and JAX's are not, in two widths.
    for i in (1, 2, np.int32(1), jnp.int32(2), np.int64(0), np.uint8(2)):
        got = call(quax_lora.select_adapter(stacked, i), X[0])
        want = _dense(models[int(i)], X[:1])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(traces) == 1


def _mixed():
    """Adapters of ranks 1 to 16, each with its own alpha, one rsLoRA."""
    specs = [(1, 2.0), (3, 3.0), (4, 16.0), (6, 6.0), (9, 1.0), (16, 32.0)]
    models = [_tuned(10 + j, rank=r, alpha=a) for j, (r, a) in enumerate(specs)]
    models.append(_tuned(30, rank=5, alpha=4.0, variant="rslora"))
    return models


def _check_rows(got, models, adapter):
    for r, j in enumerate(adapter):
        np.testing.assert_allclose(
            got[r], _dense(models[j], X[r : r + 1])[0], rtol=1e-5, atol=1e-6
        )


def _gathered(traces):
    @jax.jit
    def call(model, xs, index):
        traces.append(xs.shape)
        return jax.vmap(
            lambda x, i: quax.quaxify(quax_lora.select_adapter(model, i))(x)
        )(xs, index)

    return call


def test_mixed_ranks_padded_to_the_largest():
    models = _mixed()
    stacked = quax_lora.stack_mixed_ranks(models)
    layer = stacked.first.weight
    # Rank 16 is capped at 12 in the 16 x 12 layer (loraify's rule).
    assert layer.rank == 12 and layer.adapters == len(models) and layer.alpha is None
    traces = []
    call = _gathered(traces)
    for adapter in ([0, 5, 6, 2, 3], [1, 1, 4, 6, 0]):
        _check_rows(call(stacked, X, jnp.array(adapter)), models, adapter)
    assert len(traces) == 1
    with pytest.raises(ValueError, match="pass rank >= 12"):
        quax_lora.stack_mixed_ranks(models, rank=8)


def test_mixed_ranks_in_power_of_two_buckets():
    models = _mixed()
    buckets = quax_lora.bucket_by_rank(models)
    assert buckets.ranks == (1, 4, 8, 16)
    np.testing.assert_array_equal(buckets.bucket, [0, 1, 1, 2, 3, 3, 2])
    np.testing.assert_array_equal(buckets.index, [0, 0, 1, 0, 0, 1, 1])
    traces = []
    call = _gathered(traces)
    for adapter in ([0, 5, 6, 2, 3], [4, 5, 6, 3, 1]):
        got = quax_lora.serve_by_bucket(call, buckets, X, adapter)
        _check_rows(got, models, adapter)
    # One program per (bucket, rows rounded up to a power of two): the first
    # batch compiles (0, 1), (1, 1), (2, 2), (3, 1); the second reuses (1, 1)
    # and (2, 2) and compiles (3, 2).
    assert len(traces) == 5
    with pytest.raises(ValueError, match="one adapter per row"):
        quax_lora.serve_by_bucket(call, buckets, X, [0, 1])
    with pytest.raises(ValueError, match="the buckets hold 7"):
        quax_lora.serve_by_bucket(call, buckets, X, [0, 1, 2, 3, 7])
    with pytest.raises(ValueError, match="above the largest bucket 8"):
        quax_lora.bucket_by_rank(models, buckets=[4, 8])


def test_for_serving_refuses_stacked_adapters():
    stacked = quax_lora.stack_adapters([_tuned(1), _tuned(2)])
    with pytest.raises(ValueError, match="before stacking them"):
        quax_lora.for_serving(stacked)
