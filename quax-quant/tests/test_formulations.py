"""The formulations of the weight-only product (`quax_quant.Kernels`): each one
("fused" with each way of unpacking 4-bit values and of decoding NF4, "reduce",
"pallas" in interpret mode) against NumPy on the NumPy dequantisation, for every
format and layout, both sides, an NNX kernel `(in, out)` and a batched product,
float32 and bfloat16 activations; their derivatives and `vmap`; NaN rows; the
setting itself (`quax_quant.kernels`, the environment variable, the backend
defaults, `jit`'s cache); and a Pallas kernel that does not compile taking the
XLA path, logged, never an error."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import quax
import quax_quant as qq
from quax_quant import _matmul, _pallas


FIELDS = ("int8", "int4", "nf4", "float8")

# Each formulation: the choices for every format.
FORMULATIONS = {
    "fused, shift": {"kernel": "fused", "unpack": "shift"},
    "fused, gather": {"kernel": "fused", "nf4_levels": "gather"},
    "fused, halves": {"kernel": "fused", "unpack": "halves"},
    "fused, halves, gather": {
        "kernel": "fused",
        "unpack": "halves",
        "nf4_levels": "gather",
    },
    "reduce": {"kernel": "reduce"},
    "reduce, gather": {"kernel": "reduce", "nf4_levels": "gather"},
    "pallas": {"kernel": "pallas"},
}


def _choices(name):
    spec = dict(FORMULATIONS[name])
    kernel = spec.pop("kernel")
    return {**dict.fromkeys(FIELDS, kernel), **spec}


# `quantise` arguments for a weight `(128, 256)`, `(out, in)`.
LAYOUTS = {
    "int8 per channel": {"bits": 8, "axis": 0},
    "int8 per tensor": {"bits": 8},
    "int8 asymmetric per channel": {"bits": 8, "axis": 0, "symmetric": False},
    "int8 groups of 128": {"bits": 8, "group_size": 128},
    "int4 groups of 64": {"bits": 4, "group_size": 64},
    "int4 asymmetric groups of 32": {"bits": 4, "group_size": 32, "symmetric": False},
    "int4 per channel": {"bits": 4, "axis": 0},
    "int4 groups of 64 along outputs": {"bits": 4, "group_size": 64, "group_axis": 0},
    "nf4 blocks of 64, double quant": {"format": "nf4", "double_quant": True},
    "nf4 blocks of at most 100 (86 + 85 + 85)": {"format": "nf4", "block_size": 100},
    "float8 e4m3fn per channel": {"format": "float8_e4m3fn", "axis": 0},
    "float8 e5m2 per tensor": {"format": "float8_e5m2"},
}

W = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (128, 256)) / 16)


def _field(layout):
    """The `quax_quant.kernels` field of the layout's format: `"int8"`, `"int4"`,
    `"nf4"` or `"float8"`."""
    kwargs = LAYOUTS[layout]
    fmt = kwargs.get("format", "int")
    if fmt == "int":
        return f"int{kwargs['bits']}"
    return "float8" if fmt.startswith("float8") else fmt


def _cases(layouts):
    """Every formulation with every layout, as `(name, layout)` pairs. A pair whose
    formulation changes a choice the layout's format never reads (`unpack` from
    `"shift"`, read by the 4-bit formats only; `nf4_levels` from `"select"`, read
    by NF4 only) runs the very program of the formulation without that choice: a
    sweep (`bash scripts/test.sh sweeps`), as CI runs that program once."""
    unread = {"unpack": ("shift", ("int4", "nf4")), "nf4_levels": ("select", ("nf4",))}
    cases = []
    for name in sorted(FORMULATIONS):
        for layout in sorted(layouts):
            repeats = any(
                FORMULATIONS[name].get(choice, default) != default
                and _field(layout) not in readers
                for choice, (default, readers) in unread.items()
            )
            marks = [pytest.mark.sweep] if repeats else []
            cases.append(pytest.param(name, layout, marks=marks))
    return cases


def _quantised(layout, w=W):
    return qq.quantise(jnp.asarray(w), matmul="weight_only", **LAYOUTS[layout])


def _check(got, want, dtype):
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    scale = np.abs(want).max()
    np.testing.assert_allclose(
        np.asarray(got, np.float64) / scale, want / scale, atol=tol
    )


@pytest.mark.parametrize(("name", "layout"), _cases(LAYOUTS))
def test_products_match_numpy(name, layout, ref):
    """`x @ w.T` (1 and 5 rows, float32 and bfloat16), `w @ x`, and the same
    weight as an NNX kernel `(in, out)` in `x @ kernel`."""
    q = _quantised(layout)
    dense = ref.dequantise(q)
    with qq.kernels(**_choices(name)):
        for dtype in (jnp.float32, jnp.bfloat16):
            for rows in (1, 5):
                x = jax.random.normal(jax.random.PRNGKey(rows), (rows, 256))
                x = x.astype(dtype)
                x64 = np.asarray(x.astype(jnp.float32), np.float64)
                got = jax.jit(quax.quaxify(lambda w, x: x @ w.T))(q, x)
                assert got.dtype == jnp.result_type(dtype, jnp.float32)
                _check(got, x64 @ dense.T, dtype)
        x = jax.random.normal(jax.random.PRNGKey(7), (256, 3))
        got = jax.jit(quax.quaxify(lambda w, x: w @ x))(q, x)
        _check(got, dense @ np.asarray(x, np.float64), jnp.float32)
        kernel = qq.quantise(
            jnp.asarray(W.T), matmul="weight_only", **_nnx_layout(layout)
        )
        x = jax.random.normal(jax.random.PRNGKey(8), (4, 256))
        got = jax.jit(quax.quaxify(lambda k, x: x @ k))(kernel, x)
        _check(got, np.asarray(x, np.float64) @ ref.dequantise(kernel), jnp.float32)


def _nnx_layout(layout):
    """The layout's `quantise` arguments for the weight as an NNX kernel `(in,
    out)`: channels on the last axis, groups along the other axis than before."""
    kwargs = dict(LAYOUTS[layout])
    if "axis" in kwargs:
        kwargs["axis"] = 1
    elif "group_size" in kwargs or "block_size" in kwargs:
        kwargs["group_axis"] = 1 - kwargs.get("group_axis", -1) % 2
    return kwargs


@pytest.mark.parametrize("name", sorted(FORMULATIONS))
def test_batched_product(name, ref):
    """A stack of weights with a batch axis (`einsum("bok,bk->bo")`)."""
    ws = [_quantised("int4 groups of 64", W * (1 + i)) for i in range(2)]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *ws)
    x = jax.random.normal(jax.random.PRNGKey(9), (2, 256))
    fn = lambda w, x: jnp.einsum("bok,bk->bo", w, x)
    with qq.kernels(**_choices(name)):
        got = jax.jit(quax.quaxify(fn))(stacked, x)
    want = np.stack([ref.dequantise(w) @ np.asarray(x[i]) for i, w in enumerate(ws)])
    _check(got, want, jnp.float32)


@pytest.mark.parametrize(
    ("name", "layout"),
    _cases(
        [
            "int8 per channel",
            "int4 asymmetric groups of 32",
            "nf4 blocks of 64, double quant",
        ]
    ),
)
def test_derivatives_and_vmap(name, layout, ref):
    """The gradient with respect to the activations and to the scales, against
    JAX on the plain-JAX dequantisation; `vmap` over rows."""
    q = _quantised(layout).plain()
    x = jax.random.normal(jax.random.PRNGKey(10), (3, 256))
    loss = lambda w, x: jnp.sum(jnp.sin(x @ w.T))

    with_scale = lambda s, x: quax.quaxify(loss)(dataclasses.replace(q, scale=s), x)
    with qq.kernels(**_choices(name)):
        gs, gx = jax.jit(jax.grad(with_scale, argnums=(0, 1)))(q.scale, x)
        batched = jax.jit(jax.vmap(quax.quaxify(lambda w, x: w @ x), (None, 0)))(q, x)
    dense = lambda s, x: loss(ref.jnp_dequantise(dataclasses.replace(q, scale=s)), x)
    want_s, want_x = jax.grad(dense, argnums=(0, 1))(q.scale, x)
    _check(gx, np.asarray(want_x, np.float64), jnp.float32)
    _check(gs, np.asarray(want_s, np.float64), jnp.float32)
    _check(batched, np.asarray(x, np.float64) @ ref.dequantise(q).T, jnp.float32)


@pytest.mark.parametrize(("name", "layout"), _cases(["int4 groups of 64"]))
def test_a_row_holding_a_nan_is_a_nan_row(name, layout):
    q = _quantised(layout)
    x = jnp.ones((3, 256)).at[1, 5].set(jnp.nan)
    with qq.kernels(**_choices(name)):
        got = np.asarray(jax.jit(quax.quaxify(lambda w, x: x @ w.T))(q, x))
    assert np.isnan(got[1]).all() and np.isfinite(got[[0, 2]]).all()


# The setting ------------------------------------------------------------------------


def test_backend_defaults():
    assert qq.kernel_choices("cpu") == qq.Kernels()
    assert qq.kernel_choices("gpu") == qq.Kernels()
    assert qq.kernel_choices("tpu") == qq.DEFAULT_KERNELS["tpu"]
    tpu = qq.kernel_choices("tpu")
    assert (tpu.int8, tpu.int4, tpu.nf4, tpu.float8, tpu.unpack) == (
        "reduce",
        "pallas",
        "pallas",
        "reduce",
        "halves",
    )
    assert qq.kernel_choices() == _defaults()


def _defaults():
    """The formulations in force on the backend the tests run on."""
    return qq.DEFAULT_KERNELS.get(jax.default_backend(), qq.Kernels())


def test_blocks_merge_and_end():
    with qq.kernels(int4="blocked") as outer:
        assert outer.int4 == "blocked" and outer.int8 == _defaults().int8
        with qq.kernels(nf4_levels="gather") as inner:
            assert inner.int4 == "blocked" and inner.nf4_levels == "gather"
        assert qq.kernel_choices().nf4_levels == _defaults().nf4_levels
    assert qq.kernel_choices() == _defaults()


def test_bad_choices_are_refused_naming_them():
    with (
        pytest.raises(ValueError, match="unknown fields \\['int3'\\]"),
        qq.kernels(int3="fused"),
    ):
        pass
    with (
        pytest.raises(ValueError, match="int8 must be one of"),
        qq.kernels(int8="fast"),
    ):
        pass
    with pytest.raises(ValueError, match="unpack must be one of"):
        qq.Kernels(unpack="zip")
    with pytest.raises(ValueError, match="nf4_levels must be one of"):
        qq.Kernels(nf4_levels="table")


def test_the_environment_variable(monkeypatch):
    monkeypatch.setenv(qq.KERNELS_VARIABLE, "int8=fused, unpack=halves")
    assert qq.kernel_choices("cpu") == qq.Kernels(int8="fused", unpack="halves")
    with qq.kernels(int8="reduce"):
        assert qq.kernel_choices("cpu").int8 == "reduce"
    monkeypatch.setenv(qq.KERNELS_VARIABLE, "int8")
    with pytest.raises(ValueError, match="QUAX_QUANT_KERNELS='int8'"):
        qq.kernel_choices("cpu")
    monkeypatch.setenv(qq.KERNELS_VARIABLE, "int8=fast")
    with pytest.raises(ValueError, match="int8 must be one of"):
        qq.kernel_choices("cpu")


def test_jit_traces_again_under_another_choice():
    """A jitted function traced under one formulation is traced again under
    another (the setting is part of JAX's and quax's cache keys)."""
    traces = []

    def fn(w, x):
        traces.append(None)
        return x @ w.T

    f = jax.jit(quax.quaxify(fn))
    q = _quantised("int8 per channel")
    x = jnp.ones((2, 256))
    plain = f(q, x)
    with qq.kernels(int8="pallas"):
        jaxpr = str(jax.make_jaxpr(f)(q, x))
        fused = f(q, x)
    assert "pallas_call" in jaxpr
    f(q, x)
    assert len(traces) >= 2
    np.testing.assert_allclose(plain, fused, rtol=1e-5, atol=1e-5)


def test_a_kernel_that_does_not_compile_takes_the_xla_path(monkeypatch, caplog, ref):
    """On a TPU the kernel is compiled once per shape before it is used: here the
    CPU, told it is a TPU, cannot compile it (only interpret mode runs there), so
    the product takes the "fused" path, logs why, and is right. On a TPU, where the
    kernel compiles, a kernel whose compilation raises stands in for it (and the
    answers remembered for the shapes are forgotten)."""
    monkeypatch.setattr(_matmul, "_on_tpu", lambda: True)
    if jax.default_backend() == "tpu":

        def does_not_compile(*args, **kwargs):
            raise NotImplementedError("an operation Mosaic does not lower")

        monkeypatch.setattr(_pallas, "weight_only_matmul", does_not_compile)
        monkeypatch.setattr(_pallas, "_available", {})
    q = _quantised("int4 groups of 64")
    x = jax.random.normal(jax.random.PRNGKey(11), (4, 256))
    with qq.kernels(int4="pallas"), caplog.at_level(logging.INFO, "quax_quant"):
        jaxpr = str(jax.make_jaxpr(quax.quaxify(lambda w, x: x @ w.T))(q, x))
        got = jax.jit(quax.quaxify(lambda w, x: x @ w.T))(q, x)
    assert "pallas_call" not in jaxpr
    assert "does not compile" in caplog.text
    _check(got, np.asarray(x, np.float64) @ ref.dequantise(q).T, jnp.float32)
