"""What the compiled programs hold: the int8 x int8 path runs an integer dot and
never a float weight; the weight-only product at one row keeps the float weight
inside a fusion (XLA on CPU fuses the conversion into the product), and from two
rows on XLA on CPU writes out the converted weight for its dot."""

import jax.numpy as jnp
import jax.random as jr
import quax.testing
import quax_quant as qq


N, K = 96, 160


def _weight(**kwargs):
    return qq.quantise(jr.normal(jr.PRNGKey(0), (N, K)), axis=0, **kwargs)


def _entry_arrays(hlo: str) -> list[tuple[str, tuple[int, ...]]]:
    """The arrays the entry computation writes out (fusion outputs, dots, ...):
    what the program materialises, as opposed to intermediates inside fusions."""
    entry = hlo[hlo.index("ENTRY") :]
    entry = entry[: entry.index("\n}")]
    return [a for i in quax.testing.hlo_instructions(entry) for a in i.arrays]


def test_int8_path_has_integer_dot_and_no_float_weight():
    for bits in (8, 4):
        w = _weight(bits=bits, matmul="int8")
        x = jr.normal(jr.PRNGKey(1), (16, K))
        hlo = quax.testing.assert_hlo_lacks(
            lambda w, x: x @ w.T, w, x, shapes=[(N, K), (K, N)], dtypes=["f32"]
        )
        dots = [i for i in quax.testing.hlo_instructions(hlo) if i.op == "dot"]
        assert dots and all(i.arrays == (("s32", (16, N)),) for i in dots), dots


def test_weight_only_one_row_never_writes_the_float_weight():
    grouped = qq.quantise(
        jr.normal(jr.PRNGKey(0), (N, K)), bits=4, group_size=32, symmetric=False
    )
    for w in (_weight(matmul="weight_only"), _weight(bits=4), grouped):
        x = jr.normal(jr.PRNGKey(1), (K,))
        hlo = quax.testing.compiled_hlo(lambda w, x: w @ x, w, x)
        assert ("f32", (N, K)) not in _entry_arrays(hlo)
        assert ("f32", (N, K)) in [
            a for i in quax.testing.hlo_instructions(hlo) for a in i.arrays
        ], "expected the conversion fused into the product"
        assert "f32[96,160]" not in hlo.split("ENTRY")[1].split("\n}")[0]


def test_weight_only_batch_on_cpu_writes_the_converted_weight():
    """Documented limit: XLA on CPU converts the whole weight before its dot."""
    w = _weight(matmul="weight_only")
    x = jnp.ones((16, K))
    hlo = quax.testing.compiled_hlo(lambda w, x: x @ w.T, w, x)
    assert ("f32", (N, K)) in _entry_arrays(hlo)
