"""quax-quant benchmark for calibrated quantisation: how long `quax_quant.gptq` and
`quax_quant.awq` take on a model of square linear layers, split into the
calibration passes and the algorithm itself (`quantise_columns` on one weight, the
AWQ search), and their output error against round to nearest on the same grid, on
held-out inputs. Prints Markdown tables with the date, the device and the versions.

    python benchmarks/quant_calibration.py [--quick] [--size N] [--layers L]
        [--rows R] [--batches B] [--group-size G]

On the TPU: `bash scripts/accel.sh python benchmarks/quant_calibration.py`.
"""

import argparse
import datetime
import math
import platform
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import quax
import quax_quant


class Stack(eqx.Module):
    """`layers` square linear layers with ReLU between them."""

    layers: tuple[eqx.nn.Linear, ...]

    def __init__(self, size: int, count: int, key: jax.Array):
        self.layers = tuple(
            eqx.nn.Linear(size, size, key=k) for k in jr.split(key, count)
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(self.layers):
            assert layer.bias is not None
            x = x @ layer.weight.T + layer.bias
            if i < len(self.layers) - 1:
                x = jax.nn.relu(x)
        return x


def _apply(m: Stack, x: jax.Array) -> jax.Array:
    return m(x)


def _folds(m: Stack) -> list:
    return [(m.layers[i], m.layers[i + 1]) for i in range(len(m.layers) - 1)]


def _inputs(size: int, rows: int, batches: int, seed: int) -> list[jax.Array]:
    """Correlated features of unequal magnitudes (the same distribution for every
    seed), as a network's activations are."""
    fixed = jr.PRNGKey(1000)
    scale = jnp.exp(1.5 * jr.normal(fixed, (size,)))
    mix = jnp.eye(size) + 0.3 * jr.normal(
        jr.fold_in(fixed, 1), (size, size)
    ) / math.sqrt(size)
    keys = jr.split(jr.PRNGKey(seed), batches)
    return [(jr.normal(k, (rows, size)) @ mix) * scale for k in keys]


def _seconds(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return time.perf_counter() - start, out


def _error(model, quantised, x):
    want = _apply(model, x)
    got = quax.quaxify(_apply)(quantised, x)
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


def main(
    quick: bool = False,
    size: int | None = None,
    layers: int | None = None,
    rows: int | None = None,
    batches: int | None = None,
    group_size: int = 128,
) -> dict:
    """Print the tables and return their figures (for `benchmarks/run.py`)."""
    size = size or (256 if quick else 2048)
    layers = layers or (2 if quick else 4)
    rows = rows or (512 if quick else 2048)
    batches = batches or (4 if quick else 8)
    model = Stack(size, layers, jr.PRNGKey(0))
    calib = _inputs(size, rows, batches, seed=1)
    held_out = _inputs(size, rows, 1, seed=2)[0]
    device = jax.devices()[0]
    print(
        f"{datetime.date.today().isoformat()}, {device.platform} "
        f"({device.device_kind}), {platform.machine()}, JAX {jax.__version__}, "
        f"quax-quant {getattr(quax_quant, '__version__', 'workspace')}; "
        f"{layers} layers {size} x {size}, {batches} batches of {rows} rows, "
        f"groups of {group_size}, 4 bits.\n"
    )

    # The algorithm alone on one weight: GPTQ's column loop (compile, then run).
    w = model.layers[0].weight
    x = np.asarray(jnp.concatenate(calib), np.float64)
    hessian = 2 * x.T @ x / len(x)
    first, _ = _seconds(
        lambda: quax_quant.quantise_columns(w, hessian, group_size=group_size)[0]
    )
    again, _ = _seconds(
        lambda: quax_quant.quantise_columns(w, hessian, group_size=group_size)[0]
    )
    act, _ = _seconds(
        lambda: quax_quant.quantise_columns(
            w, hessian, group_size=group_size, act_order=True
        )[0]
    )
    search_first, _ = _seconds(
        lambda: quax_quant.awq_scales(
            [w], hessian, np.abs(x).mean(0), group_size=group_size
        )[0]
    )
    search, _ = _seconds(
        lambda: quax_quant.awq_scales(
            [w], hessian, np.abs(x).mean(0), group_size=group_size
        )[0]
    )
    print("| one weight | first call (s, with compiling) | again (s) |")
    print("|---|---|---|")
    print(f"| GPTQ column loop | {first:.3f} | {again:.3f} |")
    print(f"| GPTQ column loop, act-order | - | {act:.3f} |")
    print(f"| AWQ search (20 exponents) | {search_first:.3f} | {search:.3f} |")

    # The whole model: calibration passes (one per layer, or per AWQ pair) included.
    common = {"group_size": group_size, "apply": _apply, "progress": False}
    gptq_s, gptq_model = _seconds(lambda: quax_quant.gptq(model, calib, **common))
    awq_s, awq_model = _seconds(
        lambda: quax_quant.awq(model, calib, fold=_folds, **common)
    )
    _, rtn_model = _seconds(lambda: quax_quant.awq(model, calib[:1], **common))
    rtn_error = _error(model, rtn_model, held_out)
    print()
    print("| model | time (s) | output error | error / round to nearest |")
    print("|---|---|---|---|")
    print(f"| round to nearest (AWQ's grid) | - | {rtn_error:.4f} | 1.00x |")
    figures = {
        "device": device.device_kind,
        "size": size,
        "layers": layers,
        "gptq_column_loop_seconds": again,
        "gptq_column_loop_act_order_seconds": act,
        "awq_search_seconds": search,
        "rtn_error": rtn_error,
    }
    for name, seconds, quantised in (
        ("gptq", gptq_s, gptq_model),
        ("awq", awq_s, awq_model),
    ):
        err = _error(model, quantised, held_out)
        print(f"| {name} | {seconds:.2f} | {err:.4f} | {err / rtn_error:.2f}x |")
        figures[f"{name}_seconds"] = seconds
        figures[f"{name}_error"] = err
        figures[f"{name}/rtn error"] = err / rtn_error
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="256 x 256, 2 layers")
    parser.add_argument("--size", type=int, default=None, help="2048 by default")
    parser.add_argument("--layers", type=int, default=None, help="4 by default")
    parser.add_argument("--rows", type=int, default=None, help="per batch; 2048")
    parser.add_argument("--batches", type=int, default=None, help="8 by default")
    parser.add_argument("--group-size", type=int, default=128)
    args = parser.parse_args()
    main(args.quick, args.size, args.layers, args.rows, args.batches, args.group_size)
