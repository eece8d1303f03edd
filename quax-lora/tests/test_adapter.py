"""Saving and loading adapters: the file records the settings that reproduce the
outputs (layers, shapes, rank, alpha and scaling, layout, `stop_gradient`), and
loading into a model loraified otherwise refuses, naming the layer and the
setting. Files of the earlier format (the leaves alone) still load, with a
warning."""

import io

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import quax
import quax_lora
from lora_helpers import normal


MLP = eqx.nn.MLP(5, 3, 7, depth=1, key=jr.key(0))
X = normal(jr.key(5), (5,))


def _tuned(perturb, **kwargs):
    kwargs = {"rank": 2, "alpha": 8.0, **kwargs}
    return perturb(quax_lora.loraify(MLP, key=jr.key(1), **kwargs), jr.key(2))


def _saved(model) -> io.BytesIO:
    f = io.BytesIO()
    quax_lora.save_adapter(f, model)
    f.seek(0)
    return f


def _loras_of(model):
    return [
        x
        for x in jax.tree.leaves(model, is_leaf=quax_lora.is_lora)
        if quax_lora.is_lora(x)
    ]


def _reference(model, x):
    """The MLP by hand in plain JAX, each weight `w + s a b` summed from the
    leaves with the literal scaling 8 / 2 = 4."""
    for i, layer in enumerate(model.layers):
        w = layer.weight.w + 4.0 * layer.weight.a @ layer.weight.b
        x = w @ x + layer.bias
        if i < len(model.layers) - 1:
            x = jnp.maximum(x, 0.0)
    return x


def test_round_trip_reproduces_the_outputs(perturb):
    tuned = _tuned(perturb)
    fresh = quax_lora.loraify(MLP, rank=2, alpha=8.0, key=jr.key(9))
    loaded = quax_lora.load_adapter(_saved(tuned), fresh)
    out = quax.quaxify(loaded)(X)
    np.testing.assert_allclose(out, _reference(tuned, X), rtol=1e-5, atol=1e-6)


def test_loading_into_another_alpha_refuses_naming_the_layer(perturb):
    # The case: saved at alpha=8, loaded into an alpha=16 model. Before
    # the file recorded alpha, this loaded silently and the outputs doubled their
    # update.
    file = _saved(_tuned(perturb))
    other = quax_lora.loraify(MLP, rank=2, alpha=16.0, key=jr.key(9))
    with pytest.raises(
        ValueError,
        match=r"layer `\.layers\[0\]\.weight` was saved with alpha=8\.0 \(scaling "
        r"alpha / rank = 4\.0\), and the model's has alpha=16\.0 \(scaling alpha / "
        r"rank = 8\.0\).*Loraify the model as the adapter's was",
    ):
        quax_lora.load_adapter(file, other)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rank": 3, "alpha": 12.0}, r"`\.layers\[0\]\.weight` was saved with rank=2"),
        ({"stop_gradient": False}, r"stop_gradient=True, and the model's has .*=False"),
        ({"alpha": None}, r"alpha=8\.0 .*model's has alpha=None \(scaling .* 1\.0\)"),
    ],
)
def test_every_recorded_setting_is_checked(perturb, kwargs, match):
    file = _saved(_tuned(perturb))
    other = quax_lora.loraify(MLP, key=jr.key(9), **{"rank": 2, "alpha": 8.0, **kwargs})
    with pytest.raises(ValueError, match=match):
        quax_lora.load_adapter(file, other)


def test_the_layers_are_checked_by_path(perturb):
    tuned = _tuned(perturb)
    first_only = quax_lora.loraify(
        MLP, rank=2, alpha=8.0, where=lambda m: m.layers[0], key=jr.key(9)
    )
    with pytest.raises(
        ValueError,
        match=r"the file has adapters for `\.layers\[1\]\.weight`, which the model "
        "does not adapt",
    ):
        quax_lora.load_adapter(_saved(tuned), first_only)
    other_model = eqx.nn.MLP(5, 3, 7, depth=2, key=jr.key(0))
    with pytest.raises(ValueError, match=r"shape=\(3, 7\), and the model's has .*7, 7"):
        quax_lora.load_adapter(
            _saved(tuned),
            quax_lora.loraify(other_model, rank=2, alpha=8.0, key=jr.key(9)),
        )


def test_an_equivalent_scaling_loads(perturb):
    # alpha=None scales by 1, as alpha=rank does: the outputs are the same.
    tuned = _tuned(perturb, alpha=None)
    fresh = quax_lora.loraify(MLP, rank=2, alpha=2.0, key=jr.key(9))
    loaded = quax_lora.load_adapter(_saved(tuned), fresh)
    for got, want in zip(loaded.layers, tuned.layers, strict=True):
        np.testing.assert_array_equal(got.weight.b, want.weight.b)


def test_many_differences_are_counted(perturb):
    deep = eqx.nn.MLP(4, 4, 4, depth=7, key=jr.key(0))
    file = _saved(quax_lora.loraify(deep, rank=2, alpha=8.0, key=jr.key(1)))
    other = quax_lora.loraify(deep, rank=2, alpha=16.0, key=jr.key(1))
    with pytest.raises(ValueError, match=r"layers\[3\].*and 4 more difference\(s\)"):
        quax_lora.load_adapter(file, other)


def test_a_file_of_the_earlier_format_loads_with_a_warning(perturb, tmp_path):
    tuned = _tuned(perturb)
    # What `save_adapter` wrote before the settings were recorded: the leaves.
    path = tmp_path / "old.eqx"
    eqx.tree_serialise_leaves(path, eqx.filter(tuned, quax_lora.adapter_filter(tuned)))
    fresh = quax_lora.loraify(MLP, rank=2, alpha=8.0, key=jr.key(9))
    with pytest.warns(
        quax_lora.LegacyAdapterWarning,
        match=r"earlier quax-lora versions.*alpha cannot be.*scaling alpha / rank: "
        r"4\.0 over 2 layer\(s\)",
    ):
        loaded = quax_lora.load_adapter(path, fresh)
    np.testing.assert_allclose(
        quax.quaxify(loaded)(X), _reference(tuned, X), rtol=1e-5, atol=1e-6
    )
    assert issubclass(quax_lora.LegacyAdapterWarning, quax_lora.LoraWarning)
    assert issubclass(quax_lora.LoraWarning, UserWarning)


class _Stream(io.RawIOBase):
    """The raw side of a binary file that cannot seek, such as a pipe: `open`
    gives it wrapped in an `io.BufferedReader`, as the tests do."""

    def __init__(self, data: bytes):
        self.data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_a_stream_that_cannot_seek_loads_either_format(perturb):
    tuned = _tuned(perturb)
    fresh = quax_lora.loraify(MLP, rank=2, alpha=8.0, key=jr.key(9))
    new = quax_lora.load_adapter(
        io.BufferedReader(_Stream(_saved(tuned).getvalue())), fresh
    )
    old = io.BytesIO()
    eqx.tree_serialise_leaves(old, eqx.filter(tuned, quax_lora.adapter_filter(tuned)))
    with pytest.warns(quax_lora.LegacyAdapterWarning):
        legacy = quax_lora.load_adapter(
            io.BufferedReader(_Stream(old.getvalue())), fresh
        )
    for model in (new, legacy):
        got, want = model.layers[1].weight.b, tuned.layers[1].weight.b
        np.testing.assert_array_equal(got, want)


def test_a_path_without_suffix_gets_eqx(perturb, tmp_path):
    # As `eqx.tree_serialise_leaves` names it, so that paths of earlier code work.
    quax_lora.save_adapter(str(tmp_path / "adapter"), _tuned(perturb))
    assert (tmp_path / "adapter.eqx").exists()
    fresh = quax_lora.loraify(MLP, rank=2, alpha=8.0, key=jr.key(9))
    quax_lora.load_adapter(str(tmp_path / "adapter"), fresh)


def test_save_and_load_adapter(tmp_path, perturb):
    mlp = eqx.nn.MLP(5, 3, 7, depth=1, key=jr.PRNGKey(0))
    tuned = perturb(quax_lora.loraify(mlp, rank=2, key=jr.PRNGKey(1)), jr.PRNGKey(2))
    path = tmp_path / "adapter.eqx"
    quax_lora.save_adapter(path, tuned)
    fresh = quax_lora.loraify(mlp, rank=2, key=jr.PRNGKey(9))
    loaded = quax_lora.load_adapter(path, fresh)
    for got, want in zip(_loras_of(loaded), _loras_of(tuned), strict=True):
        np.testing.assert_array_equal(got.a, want.a)
        np.testing.assert_array_equal(got.b, want.b)
        np.testing.assert_array_equal(got.w, want.w)
    # Only the adapter is in the file: a, b of two layers and their settings, far
    # smaller than the model (one wide enough that the settings, a few hundred
    # bytes, do not weigh as much as its weights).
    wide = quax_lora.loraify(
        eqx.nn.MLP(32, 16, 64, depth=1, key=jr.PRNGKey(0)), rank=2, key=jr.PRNGKey(1)
    )
    quax_lora.save_adapter(path, wide)
    full = tmp_path / "full.eqx"
    eqx.tree_serialise_leaves(full, wide)
    assert path.stat().st_size < full.stat().st_size / 2


def test_the_variant_is_recorded_and_checked(perturb):
    dora = _tuned(perturb, variant="dora")
    dora = eqx.tree_at(
        lambda m: m.layers[0].weight.magnitude,
        dora,
        dora.layers[0].weight.magnitude * 1.5,
    )
    fresh = quax_lora.loraify(MLP, rank=2, alpha=8.0, variant="dora", key=jr.key(9))
    loaded = quax_lora.load_adapter(_saved(dora), fresh)
    np.testing.assert_array_equal(
        loaded.layers[0].weight.magnitude, dora.layers[0].weight.magnitude
    )
    np.testing.assert_allclose(
        quax.quaxify(loaded)(X), quax.quaxify(dora)(X), rtol=1e-6
    )
    plain = quax_lora.loraify(MLP, rank=2, alpha=8.0, key=jr.key(9))
    with pytest.raises(ValueError, match=r"variant='dora'.*variant='lora'"):
        quax_lora.load_adapter(_saved(dora), plain)
    rs = quax_lora.loraify(MLP, rank=2, alpha=8.0, variant="rslora", key=jr.key(9))
    with pytest.raises(ValueError, match=r"variant='lora'.*variant='rslora'"):
        quax_lora.load_adapter(_saved(_tuned(perturb)), rs)
