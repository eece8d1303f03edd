"""NF4 (bitsandbytes' 4-bit NormalFloat, QLoRA's format) with double quantisation:
the code book against its definition, the quantisation against a NumPy reference
and literals, the memory, the products against the dequantised weight, and every
error path."""

import io

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_quant as qq
from scipy.special import ndtri


def test_code_book_is_the_normal_quantiles():
    """bitsandbytes' definition (`create_normal_map(offset=0.9677083)`): 8 positive
    quantiles, 7 negative ones, an exact 0, normalised to [-1, 1]. The quantiles in
    float64 by SciPy on the host (bitsandbytes takes SciPy's `norm.ppf` of float32
    probabilities), not by the backend: a TPU's float32 `ndtri` is off by 2e-5."""
    offset = 0.9677083
    positive = ndtri(np.linspace(offset, 0.5, 9, dtype=np.float32)[:-1])
    negative = -ndtri(np.linspace(offset, 0.5, 8, dtype=np.float32)[:-1])
    levels = np.sort(np.concatenate([positive, np.zeros(1), negative]))
    np.testing.assert_allclose(qq.NF4_CODE, levels / levels.max(), atol=1e-6)
    assert qq.NF4_CODE.dtype == np.float32 and qq.NF4_CODE[7] == 0.0


def _np_nf4(w, block, dtype: type = np.float64):
    """NF4 in NumPy: per block along the last axis, absmax scale, nearest level by
    brute force (argmin of the distance; ties to the lower level). An axis of
    length `d` has `ceil(d / block)` blocks of `ceil(d / blocks)` entries, the
    last one shorter where that does not divide `d` (zero-padded here, which
    changes no absmax, and cut off after)."""
    w = np.asarray(w, dtype)
    d = w.shape[-1]
    count = -(-d // block)
    size = -(-d // count)
    padded = np.pad(w, [(0, 0)] * (w.ndim - 1) + [(0, count * size - d)])
    blocks = padded.reshape(*w.shape[:-1], count, size)
    absmax = np.abs(blocks).max(-1, keepdims=True)
    absmax = np.where(absmax > 0, absmax, 1).astype(dtype)
    code = np.asarray(qq.NF4_CODE, dtype)
    index = np.abs(blocks[..., None] / absmax[..., None] - code).argmin(-1)
    out = (code[index] * absmax).reshape(padded.shape)[..., :d]
    return out, absmax[..., 0]


def test_literal():
    w = jnp.array([[1.0, -0.5, 0.3, 0.0, -2.0, 0.1, 1.2, -0.04]])
    q = qq.quantise(w, format="nf4", block_size=4)
    assert q.format == "nf4" and q.bits == 4 and q.values.shape == (1, 4)
    assert q.values.dtype == jnp.int8
    # Block 1: absmax 1; block 2: absmax 2, so 0.05, 0.6, -0.02 after dividing.
    expected = [
        [
            *(1.0, -0.5250730514526367, 0.33791524171829224, 0.0),
            *(-2.0, 2 * 0.07958029955625534, 2 * 0.5626170039176941, 0.0),
        ]
    ]
    np.testing.assert_allclose(q.dequantise(), expected, rtol=1e-7)
    np.testing.assert_array_equal(q.scale, [[1.0, 2.0]])


@pytest.mark.parametrize("shape", [(8, 128), (3, 4, 64)])
def test_matches_numpy_reference(shape):
    w = jr.normal(jr.PRNGKey(0), shape)
    q = qq.quantise(w, format="nf4")  # blocks of 64 by default
    expected, absmax = _np_nf4(w, 64)
    np.testing.assert_allclose(q.dequantise(), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(q.scale, absmax, rtol=1e-7)
    # The stored nibbles are the level indices minus 8, two per byte.
    assert q.values.shape == (*shape[:-1], shape[-1] // 2)


def _np_double(scale):
    flat = np.asarray(scale, np.float64).ravel()
    offset = flat.mean()
    pad = (-flat.size) % 256
    blocks = np.pad(flat - offset, (0, pad)).reshape(-1, 256)
    high = np.abs(blocks).max(1, keepdims=True)
    high = np.where(high > 0, high / 127, 1)
    codes = np.clip(np.round(blocks / high), -127, 127)
    return (codes * high + offset).ravel()[: flat.size].reshape(np.shape(scale))


def test_double_quantisation_against_numpy():
    # 64 x 1024: 1024 scales of blocks of 64, four blocks of 256 scales.
    w = jr.normal(jr.PRNGKey(1), (64, 1024)) * jnp.linspace(0.1, 3.0, 64)[:, None]
    plain = qq.quantise(w, format="nf4", block_size=64)
    double = qq.quantise(w, format="nf4", block_size=64, double_quant=True)
    assert isinstance(double.scale, qq.QuantisedScale)
    assert double.scale.codes.dtype == jnp.int8
    assert double.scale.codes.shape == (64, 16)
    assert double.scale.block_scale.shape == (4,)
    np.testing.assert_allclose(
        double.scale.dequantise(), _np_double(plain.scale), rtol=1e-5, atol=1e-6
    )
    # The same integers; the scales within half a step of the second quantisation.
    np.testing.assert_array_equal(double.values, plain.values)
    step = np.asarray(double.scale.block_scale).max()
    assert np.abs(double.scale.dequantise() - plain.scale).max() <= step / 2 + 1e-6
    np.testing.assert_allclose(
        double.dequantise(),
        np.asarray(plain.dequantise())
        * np.repeat(np.asarray(double.scale.dequantise() / plain.scale), 64, axis=1),
        rtol=1e-5,
        atol=1e-6,
    )


def test_double_quantised_transpose_and_slices_keep_int8_scales(ref):
    """A transpose, and a slice of whole blocks of 256 scales, keep the scales
    int8 (the bytes of the result are those of int8 codes); a slice cutting a
    block of scales dequantises them (float32). The values are the NumPy
    dequantisation's, moved as the operation moves them."""
    # 64 x 1024 in blocks of 64: scales (64, 16), 1,024 codes, 4 blocks of 256.
    w = jr.normal(jr.PRNGKey(1), (64, 1024))
    double = qq.quantise(w, format="nf4", block_size=64, double_quant=True)
    dense = ref.dequantise(double)
    codes, blocks = 64 * 16, 4  # int8 codes, float32 block scales
    transposed = quax.quaxify(lambda w: w.T)(double)
    assert isinstance(transposed.scale, qq.QuantisedScale)
    assert transposed.scale.codes.dtype == jnp.int8
    assert transposed.nbytes == double.nbytes == 64 * 1024 // 2 + codes + 4 * blocks + 4
    np.testing.assert_allclose(ref.dequantise(transposed), dense.T, rtol=1e-6)
    # Back again, and a product with the transposed array.
    again = quax.quaxify(lambda w: w.T.T)(double)
    assert again.scale.permutation is None
    x = jr.normal(jr.PRNGKey(2), (3, 1024))
    np.testing.assert_allclose(
        quax.quaxify(lambda w, x: x @ w.T)(double, x),
        np.asarray(x, np.float64) @ dense.T,
        rtol=1e-4,
        atol=1e-3,
    )
    # Rows 16:48 hold scales 256:768, blocks 1 and 2: whole blocks, int8.
    rows = quax.quaxify(lambda w: w[16:48])(double)
    assert isinstance(rows.scale, qq.QuantisedScale)
    assert rows.nbytes == 32 * 1024 // 2 + 32 * 16 + 4 * 2 + 4
    np.testing.assert_allclose(ref.dequantise(rows), dense[16:48], rtol=1e-6)
    # The same rows of the transposed array: columns 16:48, whole blocks too.
    cols = quax.quaxify(lambda w: w.T[:, 16:48])(double)
    assert isinstance(cols.scale, qq.QuantisedScale)
    assert cols.nbytes == rows.nbytes
    np.testing.assert_allclose(ref.dequantise(cols), dense[16:48].T, rtol=1e-6)
    # Rows 8:40 start inside a block of scales (scale 128): float32 scales.
    cut = quax.quaxify(lambda w: w[8:40])(double)
    assert not isinstance(cut.scale, qq.QuantisedScale)
    assert cut.nbytes == 32 * 1024 // 2 + 4 * 32 * 16
    np.testing.assert_allclose(ref.dequantise(cut), dense[8:40], rtol=1e-6)
    # Groups of columns cut every row's scales: float32 too, values right.
    half = quax.quaxify(lambda w: w[:, :512])(double)
    assert not isinstance(half.scale, qq.QuantisedScale)
    np.testing.assert_allclose(ref.dequantise(half), dense[:, :512], rtol=1e-6)


def test_memory_per_weight():
    """0.5 bytes per weight, plus 4 bytes per 64 (plain scales: 0.5625 bytes per
    weight), or 1 byte per 64, 4 per 64 * 256 and a 4-byte offset (double)."""
    n = 256 * 1024
    w = jr.normal(jr.PRNGKey(2), (256, 1024))
    plain = qq.quantise(w, format="nf4", block_size=64)
    double = qq.quantise(w, format="nf4", block_size=64, double_quant=True)
    assert plain.nbytes == n // 2 + 4 * n // 64
    assert double.nbytes == n // 2 + n // 64 + 4 * n // (64 * 256) + 4
    assert double.nbytes / n == pytest.approx(0.5 + 1 / 64 + 4 / 16384 + 4 / n)


@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("rows", [1, 8])
def test_products_match_the_dequantised_weight(double_quant, rows):
    w = jr.normal(jr.PRNGKey(3), (48, 128))
    q = qq.quantise(w, format="nf4", double_quant=double_quant)
    assert qq.matmul_path(rows, q, (1,)) == "weight_only"
    x = jr.normal(jr.PRNGKey(4), (rows, 128))
    dense = np.asarray(q.dequantise())
    for run in (
        quax.quaxify(lambda w, x: x @ w.T),
        jax.jit(quax.quaxify(lambda w, x: x @ w.T)),
    ):
        with quax.track_materialisation() as report:
            out = run(q, x)
        assert not report
        np.testing.assert_allclose(out, x @ dense.T, rtol=1e-5, atol=1e-5)
    # Transposed and sliced (the scale then stored as floats), and a gradient.
    np.testing.assert_allclose(
        quax.quaxify(lambda w, x: w.T[:64].T @ x.T[:64])(q, x),
        dense[:, :64] @ np.asarray(x).T[:64],
        rtol=1e-5,
        atol=1e-5,
    )
    grad = jax.grad(lambda x: jnp.sum(quax.quaxify(lambda w, x: x @ w.T)(q, x) ** 2))(x)
    want = 2 * (x @ dense.T) @ dense
    # Each entry is a float32 sum of terms up to `max|want|` in size, whose rounding
    # depends on the order XLA accumulates them in (AVX2 and AVX-512 machines differ):
    # an entry near zero by cancellation is off by `eps * max|want|`, not by its own
    # size times `eps`. A wrong dequantised weight is off by far more.
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_quantise_model_and_checkpoint():
    import equinox as eqx

    mlp = eqx.nn.MLP(128, 8, 64, depth=1, key=jr.PRNGKey(5))
    model = qq.quantise_model(mlp, format="nf4", double_quant=True)
    w = model.layers[0].weight
    assert w.format == "nf4" and w.group_sizes == (1, 64)
    header = qq.describe(w)
    assert header["format"] == "nf4" and header["double_quant"] == 256
    buffer = io.BytesIO()
    qq.save_quantised(buffer, model)
    buffer.seek(0)
    like = qq.quantise_model(mlp, format="nf4", double_quant=True)
    loaded = qq.load_quantised(buffer, like)
    x = jr.normal(jr.PRNGKey(6), (128,))
    np.testing.assert_array_equal(quax.quaxify(loaded)(x), quax.quaxify(model)(x))
    buffer.seek(0)
    int4 = qq.quantise_model(mlp, bits=4, group_size=64, double_quant=True)
    with pytest.raises(ValueError, match="format='nf4'"):
        qq.load_quantised(buffer, int4)


def test_nonfinite():
    w = jnp.ones((2, 128)).at[1, 70].set(jnp.nan)
    with pytest.raises(ValueError, match="non-finite"):
        qq.quantise(w, format="nf4")
    # Traced: the block of 64 holding it is NaN, the rest as without it.
    q = jax.jit(lambda w: qq.quantise(w, format="nf4"))(w)
    deq = np.asarray(q.dequantise())
    assert np.isnan(deq[1, 64:]).all()
    np.testing.assert_array_equal(deq[0], 1.0)
    np.testing.assert_array_equal(deq[1, :64], 1.0)
    out = quax.quaxify(lambda w, x: w @ x)(q, jnp.ones(128))
    assert np.isnan(out[1]) and out[0] == 128
    # Double quantised: its NaN scale makes the block of 256 scales holding it NaN
    # (here all four scales): more NaN than dense JAX, never a finite number.
    q = jax.jit(lambda w: qq.quantise(w, format="nf4", double_quant=True))(w)
    assert np.isnan(q.dequantise()).all()
    assert np.isnan(quax.quaxify(lambda w, x: w @ x)(q, jnp.ones(128))).all()


def test_errors():
    w = jnp.ones((4, 128))
    with pytest.raises(ValueError, match="format must be one of"):
        qq.quantise(w, format="nf5")
    with pytest.raises(ValueError, match="stores 4-bit values, got bits=8"):
        qq.quantise(w, format="nf4", bits=8)
    with pytest.raises(ValueError, match="symmetric=True"):
        qq.quantise(w, format="nf4", symmetric=False)
    with pytest.raises(ValueError, match="calibration='mse'"):
        qq.quantise(w, format="nf4", calibration="mse")
    with pytest.raises(ValueError, match=r"block_size.*group_size"):
        qq.quantise(w, format="nf4", block_size=64, group_size=64)
    with pytest.raises(ValueError, match="matmul must be one of"):
        qq.quantise(w, format="nf4", matmul="int8")
    q = qq.quantise(w, format="nf4")
    with pytest.raises(ValueError, match="zero_point must be None"):
        qq.QuantisedArray(
            q.values,
            q.scale,
            jnp.zeros_like(q.scale),
            None,
            bits=4,
            float_dtype=jnp.float32,
            format="nf4",
        )
    with pytest.raises(ValueError, match="for format 'nf4' must be int8"):
        qq.QuantisedArray(
            q.values.astype(jnp.int16),
            q.scale,
            None,
            None,
            bits=4,
            float_dtype=jnp.float32,
            format="nf4",
        )
    codes = jnp.zeros((4, 2), jnp.int8)
    with pytest.raises(ValueError, match=r"block_scale must have shape \(1,\)"):
        qq.QuantisedScale(codes, jnp.ones(2), jnp.zeros(()))
    with pytest.raises(ValueError, match="codes must be int8"):
        qq.QuantisedScale(codes.astype(jnp.int32), jnp.ones(1), jnp.zeros(()))
    with pytest.raises(ValueError, match="offset must be a scalar"):
        qq.QuantisedScale(codes, jnp.ones(1), jnp.zeros(1))
    with pytest.raises(ValueError, match="block_scale must be float32"):
        qq.QuantisedScale(codes, jnp.ones(1, jnp.float16), jnp.zeros(()))
    scale = qq.QuantisedScale(codes, jnp.ones(1), jnp.zeros(()))
    with pytest.raises(ValueError, match="dequantise to float_dtype bfloat16"):
        qq.QuantisedArray(
            q.values,
            scale,
            None,
            None,
            bits=4,
            float_dtype=jnp.bfloat16,
            format="nf4",
        )


# Any length (issue 45: NF4 refused lengths its block did not divide, where
# bitsandbytes blocks the flattened tensor and pads its last block) --------------------

# (shape, block, scale shape, entries per block)
ANY_LENGTH = [
    ((3, 100), 64, (3, 2), 50),
    ((2, 130), 64, (2, 3), 44),  # 44, 44 and 42
    ((5, 7), 64, (5, 1), 7),  # shorter than one block: one block per row
    ((4, 10), 4, (4, 3), 4),  # 4, 4 and 2
    ((2, 3, 33), 8, (2, 3, 5), 7),  # 7, 7, 7, 7 and 5
]


@pytest.mark.parametrize(("shape", "block", "scales", "size"), ANY_LENGTH)
def test_any_length_matches_numpy_reference(shape, block, scales, size):
    w = jr.normal(jr.PRNGKey(0), shape)
    q = qq.quantise(w, format="nf4", block_size=block)
    assert q.shape == shape and q.scale.shape == scales
    assert q.group_sizes[-1] == size
    assert q.values.shape == (*shape[:-1], -(-shape[-1] // 2))
    expected, absmax = _np_nf4(w, block, np.float32)
    np.testing.assert_array_equal(q.scale, absmax)
    np.testing.assert_array_equal(q.dequantise(), expected)
    # The same scales as padding each row's last block: ceil(d / block) of them.
    assert q.scale.shape[-1] == -(-shape[-1] // block)


@pytest.mark.parametrize(("shape", "block", "scales", "size"), ANY_LENGTH)
def test_any_length_round_trips_exactly(shape, block, scales, size):
    """A weight whose entries are NF4 levels times their block's absmax (each
    block holding a level of +-1) quantises to itself."""
    rng = np.random.default_rng(0)
    d = shape[-1]
    index = rng.integers(0, 16, shape)
    starts = np.arange(0, d, size)
    index[..., starts] = rng.choice([0, 15], (*shape[:-1], len(starts)))
    absmax = rng.uniform(0.5, 4.0, scales).astype(np.float32)
    block_of = np.arange(d) // size
    w = qq.NF4_CODE[index] * absmax[..., block_of]
    q = qq.quantise(jnp.asarray(w), format="nf4", block_size=block)
    np.testing.assert_array_equal(q.dequantise(), w)
    np.testing.assert_array_equal(q.scale, absmax)
    double = qq.quantise(
        jnp.asarray(w), format="nf4", block_size=block, double_quant=True
    )
    assert double.shape == shape


# The lengths times double quantisation: CI runs each length once, double
# quantised at the second and the fourth (the scales stored quantised, read the
# same way at any length); the other four repeat a length's products with the other
# storage of its scales (6-7 s of compiles each): sweeps (`bash scripts/test.sh
# sweeps`).
@pytest.mark.parametrize(
    ("double_quant", "shape", "block", "scales", "size"),
    [
        pytest.param(
            double_quant,
            *case,
            id=f"{double_quant}-shape{i}-{case[1]}-scales{i}-{case[3]}",
            marks=[] if double_quant == (i % 2 == 1) else [pytest.mark.sweep],
        )
        for double_quant in (False, True)
        for i, case in enumerate(ANY_LENGTH[:4])
    ],
)
def test_any_length_products(shape, block, scales, size, double_quant, ref):
    """Products on every side and row count (one fused row, blocked rows), and
    the gradient with respect to the activations, against NumPy on the NumPy
    dequantisation."""
    w = jr.normal(jr.PRNGKey(1), shape)
    q = qq.quantise(w, format="nf4", block_size=block, double_quant=double_quant)
    dense = ref.dequantise(q)
    for rows in (1, 8):
        x = np.asarray(jr.normal(jr.PRNGKey(rows), (rows, shape[1])))
        for fn in (lambda w, x: x @ w.T, lambda w, x: w @ x.T):
            for run in (quax.quaxify(fn), jax.jit(quax.quaxify(fn))):
                np.testing.assert_allclose(
                    run(q, x), fn(dense, x), rtol=1e-5, atol=1e-5
                )
        loss = lambda w, x: jnp.sum(jnp.sin(x @ w.T))
        grad = jax.jit(quax.quaxify(jax.grad(loss, argnums=1)))(q, x)
        want = np.cos(x @ dense.T) @ dense
        np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-4)


def test_any_length_blocked_product_along_the_shorter_block(ref):
    """`x @ w` with the blocks along the free axis of a weight above
    `BLOCK_ELEMENTS`: the product runs over parts of whole blocks, then the rest,
    then the shorter last block on its own: 88,001 = 1375 blocks of 64 and one
    of 1, in parts of 1365 blocks (2**18 elements), so the rest is 10 whole
    blocks and the last one, which as one part would read as 11 blocks of 59."""
    w = jr.normal(jr.PRNGKey(2), (3, 88_001))
    q = qq.quantise(w, format="nf4", block_size=64)
    assert q.size > qq.BLOCK_ELEMENTS and q.group_sizes == (1, 64)
    assert q.scale.shape == (3, 1376)
    x = np.asarray(jr.normal(jr.PRNGKey(3), (2, 3)))
    got = jax.jit(quax.quaxify(lambda w, x: x @ w))(q, x)
    np.testing.assert_allclose(got, x @ ref.dequantise(q), rtol=1e-5, atol=1e-5)


def test_any_length_structural_operations(ref):
    """Slices keep the quantisation where the part has the same blocks (whole
    blocks from a boundary, or the shorter last block alone); others, and
    reshapes merging the axis, are refused naming the primitive."""
    w = jr.normal(jr.PRNGKey(4), (2, 130))
    q = qq.quantise(w, format="nf4")  # blocks of 44, 44 and 42
    dense = ref.dequantise(q)
    for fn in (
        lambda w: w[:, :88],
        lambda w: w[:, 88:],
        lambda w: w[:, 44:88],
        lambda w: w[1:],
        lambda w: w.T,
        lambda w: w.reshape(1, 2, 130),
    ):
        got = quax.quaxify(fn)(q)
        assert isinstance(got, qq.QuantisedArray)
        np.testing.assert_array_equal(ref.dequantise(got), fn(dense))
    for fn, primitive in (
        (lambda w: w[:, 44:], "slice"),  # blocks of 44 and 42 would read as 43
        (lambda w: w[:, 10:], "slice"),
        (lambda w: w.reshape(-1), "reshape"),
    ):
        with pytest.raises(qq.QuantMaterialisationError, match=f"`{primitive}`"):
            quax.quaxify(fn)(q)
        allowed = quax.quaxify(fn)(q.enable_materialise())
        np.testing.assert_allclose(allowed, fn(dense), rtol=1e-6)


def test_any_length_in_a_model_and_a_checkpoint(tmp_path, ref):
    """`quantise_model` on a Linear of 100 inputs (refused before), saved and
    loaded, its layout described."""
    import equinox as eqx

    model = eqx.nn.Linear(100, 3, key=jr.PRNGKey(5))
    qmodel = qq.quantise_model(model, format="nf4", double_quant=True)
    assert qmodel.weight.scale.shape == (3, 2)
    info = qq.describe(qmodel.weight)
    assert info["group_sizes"] == [1, 50] and info["group_size"] == 50
    path = str(tmp_path / "nf4.eqx")
    qq.save_quantised(path, qmodel)
    loaded = qq.load_quantised(
        path, qq.quantise_model(model, format="nf4", double_quant=True)
    )
    x = jr.normal(jr.PRNGKey(6), (100,))
    want = ref.dequantise(qmodel.weight) @ np.asarray(x) + np.asarray(model.bias)
    np.testing.assert_allclose(quax.quaxify(loaded)(x), want, rtol=1e-5, atol=1e-5)


def test_partial_blocks_only_for_nf4():
    """The constructor takes blocks that do not divide an axis for NF4 alone (the
    int8 and float8 products split the contraction into equal groups), and never
    an empty block."""
    values = jnp.zeros((2, 5), jnp.int8)
    with pytest.raises(ValueError, match="dividing the array's"):
        qq.QuantisedArray(
            values, jnp.ones((2, 2)), None, None, bits=8, float_dtype=jnp.float32
        )
    nf4 = qq.quantise(jnp.ones((2, 10)), format="nf4", block_size=4)
    # 10 entries in 6 blocks would be blocks of 2 with the last one empty.
    with pytest.raises(ValueError, match="leaves none empty"):
        qq.QuantisedArray(
            nf4.values,
            jnp.ones((2, 6)),
            None,
            None,
            bits=4,
            float_dtype=jnp.float32,
            format="nf4",
        )
