"""quax-lora benchmark: many adapters in one batch (multi-LoRA serving). A batch of
rows, each with its own adapter among `k`, through an MLP whose `LoraArray`s stack
the `k` adapters, three ways, each compiled with `jit`:

- gathered: `jax.vmap` over the rows of `quaxify(select_adapter(model, i))(x)`, so
  each product is `w x + s a[i] (b[i] x)` (quax-lora's rule, gathers of the
  factors);
- looped: for each adapter `j` in turn (`lax.scan`), the whole batch through the
  model with adapter `j` (factored), keeping the rows of adapter `j`;
- merged: for each adapter `j`, its dense weights `w + s a[j] b[j]` (`merge`), the
  whole batch through them, keeping the rows of adapter `j`.

Times are medians over interleaved rounds (each timed call right after an untimed
one of the same program, in a random order each round); ratios are medians of the
per-round ratios. Prints a Markdown table and returns the figures.

    python benchmarks/lora_multi.py [--quick]
"""

import argparse
import importlib.util
import pathlib
import statistics

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import quax
import quax_lora
from jax import lax


WIDTH, RANK, DEPTH, BATCH = 512, 8, 2, 64
ADAPTERS = (1, 8, 64)
ROUNDS = 21  # `quick`: 5


def make_model(k: int):
    mlp = eqx.nn.MLP(WIDTH, WIDTH, WIDTH, depth=DEPTH - 1, key=jr.key(0))
    base = quax_lora.loraify(mlp, rank=RANK, alpha=16.0, key=jr.key(1))

    def tuned(j):
        def leaf(x):
            if not quax_lora.is_lora(x):
                return x
            return x.replace(b=0.01 * jr.normal(jr.fold_in(jr.key(2), j), x.b.shape))

        return jax.tree.map(leaf, base, is_leaf=quax_lora.is_lora)

    return quax_lora.stack_adapters([tuned(j) for j in range(k)])


def _row(model, x, i):
    return quax.quaxify(quax_lora.select_adapter(model, i))(x)


def gathered(model, xs, index):
    return jax.vmap(_row, in_axes=(None, 0, 0))(model, xs, index)


def _each_adapter(model, xs, index, forward):
    """The batch through every adapter `j` in turn, keeping the rows of `j`."""
    k = next(
        x.adapters
        for x in jax.tree.leaves(model, is_leaf=quax_lora.is_lora)
        if quax_lora.is_lora(x)
    )

    def step(out, j):
        ys = forward(quax_lora.select_adapter(model, j), xs)
        return jnp.where((index == j)[:, None], ys, out), None

    out, _ = lax.scan(step, jnp.zeros((xs.shape[0], WIDTH)), jnp.arange(k))
    return out


def looped(model, xs, index):
    return _each_adapter(model, xs, index, quax.quaxify(lambda m, xs: jax.vmap(m)(xs)))


def merged(model, xs, index):
    return _each_adapter(
        model, xs, index, lambda m, xs: jax.vmap(quax_lora.merge(m))(xs)
    )


def _lora_benchmark():
    """`benchmarks/lora.py`, for its timing loop (this file may be loaded by path,
    as `benchmarks/run.py` does, so not as a package)."""
    path = pathlib.Path(__file__).with_name("lora.py")
    spec = importlib.util.spec_from_file_location("quax_benchmark_lora", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_times(fns, args, rounds):
    compiled = [eqx.filter_jit(fn) for fn in fns]
    calls = [lambda c=c: c(*args) for c in compiled]
    return _lora_benchmark().interleaved_times(calls, rounds)


def main(quick: bool = False) -> dict:
    rounds = 5 if quick else ROUNDS
    xs = jr.normal(jr.key(3), (BATCH, WIDTH))
    rows = []
    for k in ADAPTERS:
        model = make_model(k)
        index = jr.randint(jr.key(4), (BATCH,), 0, k)
        want = merged(model, xs, index)
        got = eqx.filter_jit(gathered)(model, xs, index)
        error = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
        assert error < 1e-4, f"gathered and merged disagree at k={k}: {error}"
        t_g, t_l, t_m = run_times(
            (gathered, looped, merged), (model, xs, index), rounds
        )
        rows.append(
            {
                "adapters": k,
                "gathered_ms": 1e3 * statistics.median(t_g),
                "looped_ms": 1e3 * statistics.median(t_l),
                "merged_ms": 1e3 * statistics.median(t_m),
                "looped_over_gathered": statistics.median(
                    a / b for a, b in zip(t_l, t_g, strict=True)
                ),
                "merged_over_gathered": statistics.median(
                    a / b for a, b in zip(t_m, t_g, strict=True)
                ),
            }
        )
    print(
        f"MLP of {DEPTH} {WIDTH}x{WIDTH} layers, rank {RANK}, batch {BATCH}, "
        f"{rounds} rounds\n"
    )
    print(
        "| adapters k | gathered (ms) | looped (ms) | looped / gathered "
        "| merged (ms) | merged / gathered |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['adapters']} | {r['gathered_ms']:.3f} | {r['looped_ms']:.3f} | "
            f"{r['looped_over_gathered']:.2f}x | {r['merged_ms']:.3f} | "
            f"{r['merged_over_gathered']:.2f}x |"
        )
    return {"rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    main(parser.parse_args().quick)
