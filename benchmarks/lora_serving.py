"""quax-lora benchmark: serving 64 adapters of ranks 4 to 64 in one batch (issue
48 item 5). A batch of rows (one token each, as in a decode step), each row with
its own adapter, through a two-layer model whose `LoraArray`s hold the adapters,
four ways, each compiled with `jax.jit`:

- padded to 64: every adapter padded with zeros to rank 64
  (`quax_lora.stack_mixed_ranks(models, rank=64)`), one gathered program
  (`jax.vmap` over rows of `select_adapter`): each row costs rank 64;
- buckets: adapters grouped by rank rounded up to a power of two (4, 8, 16, 32,
  64; `quax_lora.bucket_by_rank`), the rows of each bucket through its stack
  (`quax_lora.serve_by_bucket`: rows chosen on the host, their number rounded up
  to a power of two): each row costs its bucket's rank, at the price of one call
  per bucket;
- looped: for each adapter present in the batch, its rows through that adapter's
  own model (unpadded rank; one call per adapter, each program compiled once per
  rank and power-of-two row count);
- grouped (hand-written): not quax-lora's code, the padded stacks' factors
  multiplied by `jax.lax.ragged_dot` (one grouped product per factor and
  layer, rows sorted by adapter on the host, as Punica's SGMV kernels do), to
  tell whether a grouped kernel would pay on this backend: each adapter's
  factors read once, where the gathered program reads them once per row;
- base: the base model without adapters, the floor.

Every output is checked against the adapters' dense weights in plain JAX. Times
are medians over interleaved rounds (each timed call right after an untimed one
of the same function, in a random order each round); ratios are medians of the
per-round ratios. Reported: tokens (rows) per second, each against padding to
64, and the number of compiled programs each way. Prints a Markdown table,
writes JSON with the date, device and versions to
`benchmarks/results/lora_serving-<device kind>-<date>.json`, returns the
figures.

    python benchmarks/lora_serving.py [--quick]      # CPU, small sizes
    bash scripts/accel.sh python benchmarks/lora_serving.py --tpu   # accelerator
"""

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import pathlib
import statistics

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_lora


ADAPTERS = 64
RANKS = (4, 64)  # the smallest and largest rank drawn
# (width, rows) on the CPU, with --quick, and on an accelerator (--tpu).
SIZES = {"cpu": (512, 64), "quick": (256, 32), "tpu": (4096, 512)}
ROUNDS = {"cpu": 21, "quick": 5, "tpu": 31}
RESULTS = pathlib.Path(__file__).with_name("results")


class Model(eqx.Module):
    """Two `width x width` linear layers and a tanh: every leaf an array."""

    first: eqx.nn.Linear
    second: eqx.nn.Linear

    def __call__(self, x):
        return self.second(jnp.tanh(self.first(x)))


def make_adapters(width: int):
    """The base model and 64 fine-tuned copies with ranks drawn in [4, 64] and
    alphas of twice their rank; `b` drawn, as training leaves it."""
    keys = jr.split(jr.key(0), 2)
    base = Model(
        eqx.nn.Linear(width, width, key=keys[0]),
        eqx.nn.Linear(width, width, key=keys[1]),
    )
    rng = np.random.default_rng(0)
    ranks = rng.integers(RANKS[0], RANKS[1] + 1, ADAPTERS)
    ranks[:2] = RANKS  # both ends present
    models = []
    for j, rank in enumerate(ranks):
        model = quax_lora.loraify(
            base, rank=int(rank), alpha=2.0 * rank, key=jr.fold_in(jr.key(1), j)
        )

        def leaf(x, j=j):
            if not quax_lora.is_lora(x):
                return x
            return x.replace(b=0.01 * jr.normal(jr.fold_in(jr.key(2), j), x.b.shape))

        models.append(jax.tree.map(leaf, model, is_leaf=quax_lora.is_lora))
    return base, models, [int(r) for r in ranks]


def reference(models, xs, adapter):
    """Each row through its adapter's dense weights `w + s a b`, in plain JAX."""

    def dense(model):
        def leaf(x):
            if quax_lora.is_lora(x):
                return x.w + x.scaling * (x.a @ x.b)
            return x

        return jax.tree.map(leaf, model, is_leaf=quax_lora.is_lora)

    return jnp.stack([dense(models[j])(x) for x, j in zip(xs, adapter, strict=True)])


class Counted:
    """`jax.jit` of `fn`, counting its traces (each a compiled program)."""

    def __init__(self, fn):
        self.traces = 0

        def counted(*args):
            self.traces += 1
            return fn(*args)

        self.jitted = jax.jit(counted)

    def __call__(self, *args):
        return self.jitted(*args)


def _gathered(model, xs, index):
    return jax.vmap(lambda x, i: quax.quaxify(quax_lora.select_adapter(model, i))(x))(
        xs, index
    )


def _rows(model, xs):
    return jax.vmap(quax.quaxify(model))(xs)


def looped(call, served, xs, adapter):
    """Each adapter present in the batch in turn, its rows (their number rounded
    up to a power of two) through its own model."""
    out, order = [], []
    for j in np.unique(adapter):
        rows = np.nonzero(adapter == j)[0]
        size = 1 << (int(rows.size) - 1).bit_length()
        padded = np.concatenate([rows, np.full(size - rows.size, rows[-1])])
        out.append(call(served[j], xs[padded])[: rows.size])
        order.append(rows)
    return jnp.concatenate(out)[np.argsort(np.concatenate(order))]


def _factors(padded):
    """The weights of the padded stack's two layers: `(w, bias, a, b)` each,
    `a` `(k, n, 64)` and `b` `(k, 64, m)` with the scaling folded in."""
    out = []
    for layer in (padded.first, padded.second):
        lora = layer.weight
        assert lora.scaling == 1.0  # folded by stack_mixed_ranks
        out.append((lora.w, layer.bias, lora.a, lora.b))
    return out


def _grouped_layers(factors, xs, sizes):
    """The two layers on rows sorted by adapter: `w x + a_g (b_g x)` per group
    `g` of rows (`sizes[g]` of them), by `lax.ragged_dot`."""
    h = xs
    for i, (w, bias, a, b) in enumerate(factors):
        low = jax.lax.ragged_dot(h, jnp.swapaxes(b, 1, 2), sizes)
        h = h @ w.T + bias + jax.lax.ragged_dot(low, jnp.swapaxes(a, 1, 2), sizes)
        if i == 0:
            h = jnp.tanh(h)
    return h


def grouped(call, factors, xs, adapter):
    """Rows sorted by adapter on the host, through `call` (the jitted
    `_grouped_layers`), and put back in their order."""
    order = np.argsort(adapter, kind="stable")
    sizes = jnp.asarray(np.bincount(adapter, minlength=ADAPTERS), jnp.int32)
    out = call(factors, xs[order], sizes)
    return out[np.argsort(order)]


def _timing():
    """`interleaved_times` of `benchmarks/lora.py` (loaded by path, as
    `benchmarks/run.py` loads this file)."""
    path = pathlib.Path(__file__).with_name("lora.py")
    spec = importlib.util.spec_from_file_location("quax_benchmark_lora", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.interleaved_times


def environment() -> dict:
    device = jax.devices()[0]
    versions = {}
    for dist in ("jax", "jaxlib", "equinox", "quax-core", "quax-lora"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device_kind": device.device_kind,
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "versions": versions,
    }


def main(quick: bool = False, tpu: bool = False, json_path=None) -> dict:
    mode = "tpu" if tpu else "quick" if quick else "cpu"
    width, rows = SIZES[mode]
    rounds = ROUNDS[mode]
    base, models, ranks = make_adapters(width)
    served = [quax_lora.for_serving(m) for m in models]
    xs = jr.normal(jr.key(3), (rows, width))
    adapter = np.random.default_rng(1).integers(0, ADAPTERS, rows)

    padded = quax_lora.stack_mixed_ranks(models, rank=RANKS[1])
    buckets = quax_lora.bucket_by_rank(models)
    gathered_padded, gathered_bucket = Counted(_gathered), Counted(_gathered)
    per_adapter, plain = Counted(_rows), Counted(_rows)
    ragged = Counted(_grouped_layers)
    factors = _factors(padded)
    index = jnp.asarray(adapter)
    calls = {
        "padded to 64": lambda: gathered_padded(padded, xs, index),
        "buckets": lambda: quax_lora.serve_by_bucket(
            gathered_bucket, buckets, xs, adapter
        ),
        "looped": lambda: looped(per_adapter, served, xs, adapter),
        "grouped (hand-written)": lambda: grouped(ragged, factors, xs, adapter),
        "base": lambda: plain(base, xs),
    }
    want = reference(models, xs, adapter)
    errors = {}
    for name, call in calls.items():
        if name == "base":
            continue
        got = call()
        errors[name] = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
        assert errors[name] < 1e-3, (name, errors[name])
    times = _timing()(list(calls.values()), rounds)
    by_name = dict(zip(calls, times, strict=True))
    reference_times = by_name["padded to 64"]
    programs = {
        "padded to 64": gathered_padded.traces,
        "buckets": gathered_bucket.traces,
        "looped": per_adapter.traces,
        "grouped (hand-written)": ragged.traces,
        "base": plain.traces,
    }
    rows_out = []
    for name, t in by_name.items():
        rows_out.append(
            {
                "way": name,
                "ms": 1e3 * statistics.median(t),
                "tokens_per_s": rows / statistics.median(t),
                "time_ratio_to_padded": statistics.median(
                    a / b for a, b in zip(t, reference_times, strict=True)
                ),
                "programs": programs[name],
                "relative_error": errors.get(name),
            }
        )
    work = {
        "mean_rank": float(np.mean(ranks)),
        "mean_bucket_rank": float(
            np.mean([buckets.ranks[b] for b in buckets.bucket[adapter]])
        ),
        "padded_rank": RANKS[1],
    }
    results = {
        "environment": environment(),
        "mode": mode,
        "width": width,
        "rows": rows,
        "adapters": ADAPTERS,
        "rounds": rounds,
        "buckets": list(buckets.ranks),
        "adapter_rank_per_row": work,
        "ways": rows_out,
    }
    env = results["environment"]
    print(
        f"{env['date']}, {env['device_kind']} ({env['backend']}), JAX "
        f"{env['versions']['jax']}; {ADAPTERS} adapters of ranks {RANKS[0]}-"
        f"{RANKS[1]} (mean {work['mean_rank']:.1f}), two {width}x{width} layers, "
        f"{rows} rows (one token each), {rounds} rounds\n"
    )
    print("| way | ms | tokens/s | time / padded to 64 | programs | rel. error |")
    print("|---|---|---|---|---|---|")
    for r in rows_out:
        error = "-" if r["relative_error"] is None else f"{r['relative_error']:.1e}"
        print(
            f"| {r['way']} | {r['ms']:.3f} | {r['tokens_per_s']:.0f} | "
            f"{r['time_ratio_to_padded']:.2f}x | {r['programs']} | {error} |"
        )
    if json_path is None:
        slug = "".join(c if c.isalnum() else "-" for c in env["device_kind"].lower())
        json_path = RESULTS / f"lora_serving-{slug}-{env['date'][:10]}.json"
    json_path = pathlib.Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1))
    print(f"\nJSON: {json_path}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--tpu",
        action="store_true",
        help="the accelerator's sizes (two 4096x4096 layers, 512 rows)",
    )
    parser.add_argument("--json", help="where to write the JSON")
    args = parser.parse_args()
    main(quick=args.quick, tpu=args.tpu, json_path=args.json)
