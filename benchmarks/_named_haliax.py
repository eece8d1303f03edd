"""The attention + MLP block of `benchmarks/named.py` written with haliax, against
the same positional block, in haliax's own environment.

haliax (1.3, its latest release) needs an older JAX than quax (its `quantization`
module imports a private name that JAX 0.10 removed), so it runs in an environment
of its own, outside the repository:

    python -m venv haliax-env
    haliax-env/bin/pip install haliax==1.3 jax==0.4.30 jaxlib==0.4.30 "equinox<0.12"

`python benchmarks/named.py --haliax-python haliax-env/bin/python` (or
`QUAX_HALIAX_PYTHON=haliax-env/bin/python python benchmarks/run.py --only named`)
runs this script with that interpreter, in the same run as its own measurements,
and reads the JSON it prints: each ratio is taken against the positional block
timed in the same process (so on the same JAX), as `named.py` takes the named
block's.

The positional block is `block` of `examples/named_attention.py`, read from that
file (which imports quax, not installed here) rather than copied.
"""

import argparse
import ast
import json
import statistics
import time
from pathlib import Path
from typing import Any

import haliax as hax  # pyright: ignore[reportMissingImports]  (haliax-env, above)
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "named_attention.py"


def _positional() -> tuple[Any, dict[str, tuple[str, ...]]]:
    """`block` and `AXES` from the example, without running its imports."""
    tree = ast.parse(EXAMPLE.read_text())
    wanted: list[ast.stmt] = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "block")
        or (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "AXES" for t in node.targets)
        )
    ]
    namespace: dict[str, Any] = {"jax": jax, "jnp": jnp, "np": np}
    exec(compile(ast.Module(wanted, []), str(EXAMPLE), "exec"), namespace)
    return namespace["block"], namespace["AXES"]


block, AXES = _positional()
EMBED, HEAD, HIDDEN, BATCH = 64, 64, 256, 4


def haliax_block(p: dict[str, Any], x: Any, xk: Any) -> Any:
    """The same block, written as haliax users write it: contractions by name."""
    q = hax.dot(x, p["wq"], axis="embed")  # (batch, seq, head)
    k = hax.dot(xk, p["wk"], axis="embed")  # (batch, kseq, head)
    v = hax.dot(xk, p["wv"], axis="embed")
    scores = hax.dot(q, k, axis="head") / np.sqrt(q.axis_size("head"))
    attended = hax.dot(hax.nn.softmax(scores, axis="kseq"), v, axis="kseq")
    h = x + hax.dot(attended, p["wo"], axis="head")
    h = h - hax.mean(h, "embed")
    h = h / hax.sqrt(hax.mean(h * h, "embed") + 1e-5)
    hidden = hax.nn.gelu(hax.dot(h, p["w1"], axis="embed") + p["b1"])
    return h + hax.dot(hidden, p["w2"], axis="hidden")


def make(seq: int) -> tuple[Any, Any, Any, Any, Any]:
    """Weights and input as `benchmarks/named.py` makes them (the same keys)."""
    sizes = {"embed": EMBED, "head": HEAD, "hidden": HIDDEN}
    keys = jr.split(jr.PRNGKey(0), len(AXES) + 1)
    plain = {
        n: jr.normal(k, tuple(sizes[a] for a in ax)) / np.sqrt(EMBED)
        for (n, ax), k in zip(AXES.items(), keys, strict=False)
    }
    x = jr.normal(keys[-1], (BATCH, seq, EMBED))
    named = {n: hax.named(plain[n], tuple(AXES[n])) for n in AXES}
    hx = hax.named(x, ("batch", "seq", "embed"))
    hk = hax.named(x, ("batch", "kseq", "embed"))
    return plain, x, named, hx, hk


def _time(fn: Any, *args: Any, calls: int = 10) -> float:
    """CPU time of this process per call (as `benchmarks/named.py` measures)."""
    start = time.process_time()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.process_time() - start) / calls


def _row(seq: int, rounds: int) -> dict[str, Any]:
    """Run times of the block at one sequence length (medians over `rounds`)."""
    plain, x, named, hx, hk = make(seq)
    hal = jax.jit(
        lambda p, x, k: haliax_block(p, x, k).rearrange(("batch", "seq", "embed")).array
    )
    pos = jax.jit(block)
    diff = float(jnp.max(jnp.abs(hal(named, hx, hk) - pos(plain, x, x))))
    calls = {
        "haliax": lambda: _time(hal, named, hx, hk),
        "plain": lambda: _time(pos, plain, x, x),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for call in calls.values():
        call()
    for i in range(rounds):
        order = list(calls)[i % 2 :] + list(calls)[: i % 2]
        for k in order:
            times[k].append(calls[k]())
    pairs = zip(times["haliax"], times["plain"], strict=True)
    return {
        "seq": seq,
        "haliax_s": statistics.median(times["haliax"]),
        "plain_s": statistics.median(times["plain"]),
        "ratio": statistics.median(a / b for a, b in pairs),
        "max_abs_diff": diff,
    }


def measure(seqs: list[int], rounds: int) -> dict[str, Any]:
    rows = [_row(seq, rounds) for seq in seqs]
    plain, x, named, hx, hk = make(64)

    def trace_haliax() -> Any:
        return jax.make_jaxpr(lambda *a: haliax_block(*a))(named, hx, hk)

    def trace_plain() -> Any:
        return jax.make_jaxpr(lambda *a: block(*a))(plain, x, x)

    trace_haliax()
    trace_plain()
    th, tp = [], []
    for i in range(rounds):  # as `named.py` times its traces
        for trace, times in [(trace_haliax, th), (trace_plain, tp)][:: 1 - 2 * (i % 2)]:
            start = time.process_time()
            for _ in range(3):
                trace()
            times.append((time.process_time() - start) / 3)
    return {
        "versions": {
            "haliax": getattr(hax, "__version__", "1.3"),
            "jax": jax.__version__,
        },
        "rows": rows,
        "trace_haliax_s": statistics.median(th),
        "trace_positional_s": statistics.median(tp),
        "trace_ratio": statistics.median(a / b for a, b in zip(th, tp, strict=True)),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="32,64,128,256,512")
    parser.add_argument("--rounds", type=int, default=31)
    args = parser.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    print(json.dumps(measure(seqs, args.rounds)))
