"""The variants: rsLoRA, DoRA, LoRA dropout, `unmerge` and LoRA on
`eqx.nn.Embedding`, each against the same computation written in plain JAX on the
leaves."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax.testing
import quax_lora
from lora_helpers import normal


MLP = eqx.nn.MLP(6, 3, 8, depth=1, key=jr.key(0))
X = normal(jr.key(1), (6,))


def _mlp_reference(model, x, weight_of):
    """The MLP by hand in plain JAX, with each layer's weight `weight_of(lora)`."""
    for i, layer in enumerate(model.layers):
        x = weight_of(layer.weight) @ x + layer.bias
        if i < len(model.layers) - 1:
            x = jnp.maximum(x, 0.0)
    return x


def _perturbed(model, key):
    model = eqx.tree_at(
        lambda m: [layer.weight.b for layer in m.layers],
        model,
        [
            0.3 * normal(jr.fold_in(key, i), layer.weight.b.shape)
            for i, layer in enumerate(model.layers)
        ],
    )
    return model


def test_rslora_scales_by_alpha_over_sqrt_rank(perturb):
    model = perturb(
        quax_lora.loraify(MLP, rank=4, alpha=6.0, variant="rslora", key=jr.key(2)),
        jr.key(3),
    )
    assert model.layers[0].weight.scaling == pytest.approx(3.0)  # 6 / sqrt(4)
    out = quax.quaxify(model)(X)
    ref = _mlp_reference(model, X, lambda w: w.w + 3.0 * w.a @ w.b)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # The capped head (3 outputs, rank 3) keeps the scaling 6 / sqrt(4).
    head = model.layers[-1].weight
    assert head.rank == 3 and head.scaling == pytest.approx(3.0)


def _dora_weight(lora):
    """DoRA in plain JAX: magnitude times the rows of w + s a b over their
    (stopped) norms."""
    full = lora.w + lora.scaling * lora.a @ lora.b
    norm = jax.lax.stop_gradient(jnp.linalg.norm(full, axis=1, keepdims=True))
    return lora.magnitude[:, None] * full / norm


def test_dora_starts_at_the_base_model_and_matches_plain_jax(perturb):
    fresh = quax_lora.loraify(MLP, rank=2, alpha=4.0, variant="dora", key=jr.key(2))
    w0 = MLP.layers[0].weight
    np.testing.assert_allclose(
        fresh.layers[0].weight.magnitude, jnp.linalg.norm(w0, axis=1), rtol=1e-6
    )
    np.testing.assert_allclose(quax.quaxify(fresh)(X), MLP(X), rtol=1e-5, atol=1e-6)

    model = perturb(fresh, jr.key(3))
    model = eqx.tree_at(
        lambda m: m.layers[0].weight.magnitude,
        model,
        model.layers[0].weight.magnitude * jnp.linspace(0.5, 1.5, 8),
    )
    out = quax.quaxify(model)(X)
    np.testing.assert_allclose(
        out, _mlp_reference(model, X, _dora_weight), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        quax_lora.merge(model)(X), _mlp_reference(model, X, _dora_weight), rtol=1e-5
    )

    # The gradients of a, b and magnitude, the norm kept out of them (as peft).
    params, frozen = eqx.partition(model, quax_lora.trainable_filter(model))

    def loss(p):
        return jnp.sum(quax.quaxify(eqx.combine(p, frozen))(X) ** 2)

    def loss_ref(p):
        return jnp.sum(_mlp_reference(eqx.combine(p, frozen), X, _dora_weight) ** 2)

    got, want = jax.grad(loss)(params), jax.grad(loss_ref)(params)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    assert got.layers[0].weight.magnitude is not None


def test_dora_never_forms_the_dense_update():
    model = quax_lora.loraify(
        eqx.nn.Linear(64, 48, key=jr.key(0)), rank=2, variant="dora", key=jr.key(1)
    )
    jaxpr = jax.make_jaxpr(quax.quaxify(model))(jnp.ones(64))
    shapes = [
        tuple(v.aval.shape)
        for eqn in jaxpr.jaxpr.eqns
        if eqn.primitive.name == "dot_general"
        for v in eqn.outvars
    ]
    assert (48, 64) not in shapes and (64, 48) not in shapes, shapes


def test_dora_conv_matches_plain_jax(perturb):
    conv = eqx.nn.Conv2d(3, 5, 3, key=jr.key(0))
    model = perturb(
        quax_lora.loraify(
            conv, rank=2, alpha=2.0, variant="dora", filter=eqx.nn.Conv, key=jr.key(1)
        ),
        jr.key(2),
    )
    lora = model.weight
    x = normal(jr.key(3), (3, 7, 7))
    full = lora.w + jnp.einsum("or,rihw->oihw", lora.a, lora.b)
    norm = jnp.sqrt(jnp.sum(full**2, axis=(1, 2, 3), keepdims=True))
    dense = eqx.tree_at(
        lambda c: c.weight, model, lora.magnitude[:, None, None, None] * full / norm
    )
    np.testing.assert_allclose(quax.quaxify(model)(x), dense(x), rtol=1e-5, atol=1e-5)


def test_dropout_drops_the_adapter_input_only(perturb):
    model = perturb(
        quax_lora.loraify(MLP, rank=2, alpha=2.0, dropout=0.5, key=jr.key(2)),
        jr.key(3),
    )
    plain = _mlp_reference(model, X, lambda w: w.w + w.a @ w.b)
    # Without a key (inference), no dropout.
    np.testing.assert_allclose(quax.quaxify(model)(X), plain, rtol=1e-5, atol=1e-6)
    key = jr.key(7)
    dropped = quax_lora.with_dropout_key(model, key)
    out = quax.quaxify(dropped)(X)

    def ref(x):
        for i, layer in enumerate(model.layers):
            lora = layer.weight
            keep = jr.bernoulli(jr.fold_in(key, i), 0.5, x.shape)
            xd = jnp.where(keep, x / 0.5, 0.0)
            x = lora.w @ x + lora.a @ (lora.b @ xd) + layer.bias
            if i < len(model.layers) - 1:
                x = jnp.maximum(x, 0.0)
        return x

    np.testing.assert_allclose(out, ref(X), rtol=1e-5, atol=1e-6)
    assert not np.allclose(out, plain)
    off = quax_lora.with_dropout_key(dropped, None)
    np.testing.assert_allclose(quax.quaxify(off)(X), plain, rtol=1e-5, atol=1e-6)
    # The key is not a parameter.
    spec = quax_lora.trainable_filter(dropped)
    assert spec.layers[0].weight.dropout_key is False


def test_unmerge_recovers_the_base_weights(perturb):
    model = perturb(quax_lora.loraify(MLP, rank=2, alpha=4.0, key=jr.key(2)), jr.key(3))
    merged = quax_lora.merge(model)
    back = quax_lora.unmerge(merged, model)
    for layer, base in zip(back.layers, MLP.layers, strict=True):
        np.testing.assert_allclose(layer.weight.w, base.weight, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        quax.quaxify(back)(X), quax.quaxify(model)(X), rtol=1e-5, atol=1e-6
    )
    dora = quax_lora.loraify(MLP, rank=2, variant="dora", key=jr.key(2))
    with pytest.raises(ValueError, match="DoRA"):
        quax_lora.unmerge(quax_lora.merge(dora), dora)


class _Embedder(eqx.Module):
    embedding: eqx.nn.Embedding
    linear: eqx.nn.Linear

    def __call__(self, tokens):
        return jax.vmap(lambda t: self.linear(self.embedding(t)))(tokens)


def test_embedding_is_a_gather_of_rows(perturb):
    base = _Embedder(
        eqx.nn.Embedding(50, 16, key=jr.key(0)), eqx.nn.Linear(16, 4, key=jr.key(1))
    )
    model = perturb(
        quax_lora.loraify(
            base,
            rank=3,
            alpha=6.0,
            filter=(eqx.nn.Embedding, eqx.nn.Linear),
            key=jr.key(2),
        ),
        jr.key(3),
    )
    tokens = jnp.array([3, 0, 49, 3, 17])
    emb, lin = model.embedding.weight, model.linear.weight
    ref_rows = emb.w[tokens] + 2.0 * emb.a[tokens] @ emb.b
    ref = ref_rows @ (lin.w + 2.0 * lin.a @ lin.b).T + model.linear.bias
    call = jax.jit(lambda m, t: quax.quaxify(m)(t))
    out = call(model, tokens)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # One token, outside vmap: a dynamic slice of the rows.
    one = quax.quaxify(model.embedding)(jnp.int32(17))
    np.testing.assert_allclose(one, ref_rows[4], rtol=1e-5, atol=1e-6)
    # Never the dense (50, 16) update: no product has that shape.
    hlo = call.lower(model, tokens).compile().as_text()
    assert hlo is not None
    # The base weight is a parameter of that shape; no instruction computes one (a
    # TPU's prefetch of the parameter only moves its data).
    quax.testing.assert_hlo_lacks(
        hlo, shapes=[(50, 16)], dtypes=["f32"], ignore_parameters=True
    )
    jaxpr = jax.make_jaxpr(quax.quaxify(model))(tokens)
    shapes = [
        tuple(v.aval.shape)
        for eqn in jaxpr.jaxpr.eqns
        if eqn.primitive.name == "dot_general"
        for v in eqn.outvars
    ]
    assert (50, 16) not in shapes


@pytest.mark.parametrize("token", [17, np.int32(17), np.int64(17), -33, np.uint8(17)])
def test_embedding_indexed_by_a_python_or_numpy_integer(perturb, token):
    """A static index binds `slice` (not `gather`): `w[i] + s a[i] b`, as the
    dense `eqx.nn.Embedding` gives, eagerly, under jit and in the gradient."""
    embedding = eqx.nn.Embedding(50, 16, key=jr.key(0))
    model = perturb(
        quax_lora.loraify(
            embedding, rank=3, alpha=6.0, filter=eqx.nn.Embedding, key=jr.key(2)
        ),
        jr.key(3),
    )
    lora = model.weight

    def dense(a, b):
        return eqx.nn.Embedding(weight=lora.w + 2.0 * a @ b)(token)

    want = dense(lora.a, lora.b)
    np.testing.assert_allclose(want, embedding.weight[17] + 2.0 * lora.a[17] @ lora.b)
    np.testing.assert_allclose(quax.quaxify(model)(token), want, rtol=1e-6, atol=1e-6)
    jitted = jax.jit(lambda m: quax.quaxify(m)(token))
    np.testing.assert_allclose(jitted(model), want, rtol=1e-6, atol=1e-6)
    grads = eqx.filter_grad(lambda m: jnp.sum(jnp.sin(quax.quaxify(m)(token))))(model)
    want_a, want_b = jax.grad(lambda a, b: jnp.sum(jnp.sin(dense(a, b))), (0, 1))(
        lora.a, lora.b
    )
    np.testing.assert_allclose(grads.weight.a, want_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads.weight.b, want_b, rtol=1e-5, atol=1e-6)
    # The rows, never the dense (50, 16) update.
    jaxpr = jax.make_jaxpr(lambda m: quax.quaxify(m)(token))(model)
    assert all(
        tuple(v.aval.shape) != (50, 16)
        for eqn in jaxpr.jaxpr.eqns
        if eqn.primitive.name == "dot_general"
        for v in eqn.outvars
    )


def test_static_slices_of_rows(perturb):
    model = perturb(
        quax_lora.loraify(
            eqx.nn.Embedding(12, 5, key=jr.key(0)),
            rank=2,
            filter=eqx.nn.Embedding,
            key=jr.key(1),
        ),
        jr.key(2),
    )
    lora = model.weight
    dense = lora.w + lora.a @ lora.b
    for index in (np.s_[2:7], np.s_[::3], np.s_[-4:], np.s_[1:11:4]):
        out = quax.quaxify(lambda w: w[index])(lora)  # noqa: B023
        np.testing.assert_allclose(out, dense[index], rtol=1e-6, atol=1e-6)
    # Columns are not whole rows: no low-rank form, refused as before.
    with pytest.raises(quax_lora.LoraMaterialisationError, match="slice"):
        quax.quaxify(lambda w: w[:, 1:3])(lora)


def test_dora_on_embedding_is_refused():
    with pytest.raises(ValueError, match="Embedding"):
        quax_lora.loraify(
            eqx.nn.Embedding(5, 3, key=jr.key(0)),
            rank=2,
            variant="dora",
            filter=eqx.nn.Embedding,
            key=jr.key(1),
        )


def test_dora_products_and_structural_rules():
    lora = quax_lora.LoraArray(
        normal(jr.key(0), (5, 7)), rank=2, alpha=3.0, variant="dora", key=jr.key(1)
    )
    lora = lora.replace(
        b=0.5 * normal(jr.key(2), (2, 7)), magnitude=jnp.linspace(0.5, 2.0, 5)
    )
    dense = _dora_weight(lora)
    x, y = normal(jr.key(3), (7,)), normal(jr.key(4), (5,))
    cases = {
        "w @ x": (lambda w: w @ x, dense @ x),
        # The rows contracted: DoRA's factor scales `w` itself.
        "y @ w": (lambda w: y @ w, y @ dense),
        "-w @ x": (lambda w: (-w) @ x, -dense @ x),
        "(-3 w) @ x": (lambda w: (-3.0 * w) @ x, -3.0 * dense @ x),
        "rev": (lambda w: jnp.flip(w, axis=0) @ x, jnp.flip(dense, axis=0) @ x),
        "bf16": (
            lambda w: w.astype(jnp.bfloat16) @ x.astype(jnp.bfloat16),
            dense @ x,
        ),
    }
    for name, (f, want) in cases.items():
        got = quax.quaxify(f)(lora)
        tol = 3e-2 if name == "bf16" else 1e-5
        np.testing.assert_allclose(
            np.asarray(got, np.float32), want, rtol=tol, atol=tol, err_msg=name
        )
    # A transposed DoRA weight normalises columns: refused, not silently wrong.
    with pytest.raises(quax_lora.LoraMaterialisationError):
        quax.quaxify(lambda w: w.T @ y)(lora)
