"""`quax.map_selected`: the `filter=`/`where=` selection of whole-model helpers."""

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import pytest
import quax


def _mlp():
    return eqx.nn.MLP(3, 2, 4, depth=2, key=jr.PRNGKey(0))


def _mark(layer):
    return eqx.tree_at(lambda x: x.weight, layer, jnp.full(layer.weight.shape, 7.0))


def _marked(model):
    return [bool(jnp.all(layer.weight == 7.0)) for layer in model.layers]


def test_filter_by_type_tuple_and_predicate():
    mlp = _mlp()
    assert _marked(quax.map_selected(_mark, mlp, filter=eqx.nn.Linear)) == [True] * 3
    assert (
        _marked(quax.map_selected(_mark, mlp, filter=(eqx.nn.Conv, eqx.nn.Linear)))
        == [True] * 3
    )
    wide = quax.map_selected(
        _mark,
        mlp,
        filter=lambda x: isinstance(x, eqx.nn.Linear) and x.out_features == 4,
    )
    assert _marked(wide) == [True, True, False]
    # Nothing selected: the same tree back, with its leaves untouched.
    same = quax.map_selected(_mark, mlp, filter=eqx.nn.Conv)
    assert _marked(same) == [False] * 3
    assert same.layers[0].weight is mlp.layers[0].weight


def test_where_limits_the_selection_to_a_subtree():
    mlp = _mlp()
    last = quax.map_selected(
        _mark, mlp, filter=eqx.nn.Linear, where=lambda m: m.layers[-1]
    )
    assert _marked(last) == [False, False, True]
    both = quax.map_selected(
        _mark, mlp, filter=eqx.nn.Linear, where=lambda m: (m.layers[0], m.layers[2])
    )
    assert _marked(both) == [True, False, True]


def test_selected_nodes_are_not_descended_into():
    seen = []

    def record(node):
        seen.append(type(node).__name__)
        return node

    # The MLP itself matches: its layers are not visited.
    quax.map_selected(record, [_mlp()], filter=lambda x: isinstance(x, eqx.nn.MLP))
    assert seen == ["MLP"]


def test_where_outside_the_model_raises():
    # `eqx.tree_at`'s own error: `where` must return nodes of the model.
    with pytest.raises(TypeError, match="not a leaf of the pytree"):
        quax.map_selected(
            _mark, _mlp(), filter=eqx.nn.Linear, where=lambda m: jnp.ones(2)
        )
