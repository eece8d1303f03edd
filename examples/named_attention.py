"""A named-axis attention block, sharded by name on 8 (simulated) devices.

Unmodified positional code (an attention + MLP block written with `@`, `einsum`,
`softmax`) runs on `quax_named.NamedArray`s: every contraction is checked by name, and
a mapping from axis names to mesh axes shards it (data-parallel over `batch`,
model-parallel over `hidden` and `head`).

Run: `python examples/named_attention.py`.
"""

import math
import os
import sys


if __name__ == "__main__" and "jax" not in sys.modules:
    # 8 simulated CPU devices; set before JAX starts, and only when run as a script.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_named as qn
from jax.sharding import AxisType
from quax_named import NamedArray


EMBED, HEAD, HIDDEN = 32, 16, 64


def block(p, x, xk):
    """Positional code: knows nothing of names. `xk` is `x` with its `seq` axis
    named `kseq` (keys), so that scores have two distinct axes."""
    q, k, v = x @ p["wq"], xk @ p["wk"], xk @ p["wv"]
    scores = jnp.einsum("bqh,bkh->bqk", q, k) / np.sqrt(q.shape[-1])
    out = jnp.einsum("bqk,bkh->bqh", jax.nn.softmax(scores, axis=-1), v) @ p["wo"]
    h = x + out
    h = h - h.mean(-1, keepdims=True)
    h = h / jnp.sqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-5)
    return h + jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]


AXES = {
    "wq": ("embed", "head"),
    "wk": ("embed", "head"),
    "wv": ("embed", "head"),
    "wo": ("head", "embed"),
    "w1": ("embed", "hidden"),
    "b1": ("hidden",),
    "w2": ("hidden", "embed"),
}


def main() -> dict[str, str]:
    sizes = {"embed": EMBED, "head": HEAD, "hidden": HIDDEN}
    keys = jr.split(jr.PRNGKey(0), len(AXES) + 1)
    plain = {
        n: jr.normal(k, tuple(sizes[a] for a in ax)) / np.sqrt(EMBED)
        for (n, ax), k in zip(AXES.items(), keys, strict=False)
    }
    data = jr.normal(keys[-1], (8, 16, EMBED))  # (batch, seq, embed)
    params = {n: NamedArray(plain[n], AXES[n]) for n in AXES}
    x = NamedArray(data, ("batch", "seq", "embed"))
    xk = qn.rename(x, {"seq": "kseq"})
    print(f"input {x}, weights {params['w1']}")

    # 1. Unmodified positional code, names checked and carried.
    out = jax.jit(quax.quaxify(block))(params, x, xk)
    reference = block(plain, data, data)
    error = float(jnp.max(jnp.abs(out.array - reference)))
    print(f"named block -> {out}; max |named - positional| = {error:.1e}")

    # 2. A mistake positional code would not see: keys named like queries.
    try:
        quax.quaxify(block)(params, x, x)
    except TypeError as e:
        print(f"refused: {str(e)[:90]}...")

    # 3. Names to a mesh: shardings derived from the names.
    n = len(jax.devices())
    model = 2 if n % 2 == 0 else 1
    data = math.gcd(n // model, 8)  # divides the batch
    mesh = jax.make_mesh(
        (data, model),
        ("data", "model"),
        axis_types=(AxisType.Auto,) * 2,
        devices=jax.devices()[: data * model],
    )
    mapping = {"batch": "data", "hidden": "model", "head": "model"}
    with qn.axis_mapping(mapping, mesh):
        sparams, sx, sxk = qn.shard((params, x, xk))
        sharded = jax.jit(quax.quaxify(block))(sparams, sx, sxk)
    sharded_error = float(jnp.max(jnp.abs(sharded.array - reference)))
    spec = qn.partition_spec(sparams["w1"].axes, mapping)
    print(
        f"{data * model} devices ({data} x {model}): w1 {sparams['w1'].names} "
        f"sharded as {spec}; "
        f"max |sharded - positional| = {sharded_error:.1e}"
    )

    # 4. nmap: positional code over one named axis, vectorised over the rest.
    norms = qn.nmap(jnp.linalg.norm, "embed")(out)
    print(f"nmap(jnp.linalg.norm, 'embed') -> {norms}")

    # 5. Reshaping and scanning by name: heads split off `embed`, and running sums
    # along `seq` (each step sees one position, named `batch` and `embed`).
    heads = qn.rearrange(
        out, "batch seq (embed: heads dim) -> batch heads seq dim", heads=4
    )
    total, running = qn.scan(
        lambda c, row: (c + row, c + row), qn.sum(out, "seq") * 0.0, out, axis="seq"
    )
    scan_error = float(jnp.max(jnp.abs((total - qn.sum(out, "seq")).array)))
    print(f"rearrange -> {heads}; scan along 'seq' -> {running}, {total}")
    return {
        "devices": f"{data} x {model}",
        "output axes": " ".join(str(a) for a in out.names),
        "max |named - positional|": f"{error:.1e}",
        "max |sharded - positional|": f"{sharded_error:.1e}",
        "w1 partition spec": str(tuple(spec)),
        "heads": str(heads),
        "running sum axes": " ".join(str(a) for a in running.names),
        "max |scan total - sum|": f"{scan_error:.1e}",
    }


if __name__ == "__main__":
    main()
