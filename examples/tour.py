"""A tour of quax and its families: the main job of this repository.

Runs every example program of `examples/` in turn (each also runs on its own), with
progress, then prints a summary table and names the folder its plots were written to.
A family that is not installed is skipped, saying which distribution to install.

    bash scripts/demo.sh                  # builds the environment, then runs this
    python examples/tour.py [--out DIR]   # plots go to DIR (default: build/tour)
"""

import argparse
import dataclasses
import importlib.util
import inspect
import json
import pathlib
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import quax
import quax.testing


HERE = pathlib.Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Stop:
    """One stop of the tour: an example program and what it needs."""

    title: str
    example: str  # a file of `examples/`, without `.py`
    needs: tuple[str, ...]  # import name -> distribution, see `DISTRIBUTIONS`
    devices: int = 1  # > 1: run in a subprocess with this many simulated devices


DISTRIBUTIONS = {
    "quax_lora": "quax-lora",
    "quax_units": "quax-units",
    "quax_sparse": "quax-sparse",
    "quax_structured": "quax-structured",
    "quax_quant": "quax-quant",
    "quax_named": "quax-named",
    "diffrax": "diffrax",
    "optax": "optax",
    "flax": "flax",
}

STOPS = (
    Stop("LoRA fine-tuning of an Equinox MLP", "lora_finetune", ("quax_lora", "optax")),
    Stop(
        "A damped oscillator with units", "units_oscillator", ("quax_units", "diffrax")
    ),
    Stop(
        "A planet's orbit: constants, checked arguments, unit systems",
        "units_orbit",
        ("quax_units",),
    ),
    Stop("Conjugate gradients on a sparse Laplacian", "sparse_cg", ("quax_sparse",)),
    Stop(
        "Newton's method: a Jacobian by colouring, SuperLU solves",
        "sparse_newton",
        ("quax_sparse",),
    ),
    Stop(
        "Tridiagonal solves at O(n), and a Gaussian process",
        "structured_tridiagonal",
        ("quax_structured",),
    ),
    Stop(
        "A Gaussian process on a 3-D grid: Kronecker + noise, fitted by gradient",
        "structured_grid_gp",
        ("quax_structured", "optax"),
    ),
    Stop(
        "QLoRA: int4 base weights, LoRA adapters",
        "quant_qlora",
        ("quax_quant", "quax_lora", "optax"),
    ),
    Stop(
        "QLoRA on NF4 with double quantisation; calibrated float8",
        "quant_nf4",
        ("quax_quant", "quax_lora", "optax"),
    ),
    Stop(
        "GPTQ, then LoftQ-initialised QLoRA adapters, then fine-tuning",
        "quant_gptq_loftq",
        ("quax_quant", "quax_lora", "optax"),
    ),
    Stop(
        "QLoRA on a Flax NNX transformer, with nnx.LoRAParam",
        "nnx_qlora",
        ("quax_quant", "quax_lora", "optax", "flax"),
    ),
    Stop(
        "Named-axis attention, sharded on 8 simulated devices",
        "named_attention",
        ("quax_named",),
        devices=8,
    ),
)


def _missing(stop: Stop) -> list[str]:
    return [
        DISTRIBUTIONS.get(name, name)
        for name in stop.needs
        if importlib.util.find_spec(name) is None
    ]


def _load_main(example: str) -> Callable[..., dict[str, str]]:
    path = HERE / f"{example}.py"
    spec = importlib.util.spec_from_file_location(f"quax_tour_{example}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _run_on_devices(stop: Stop) -> dict[str, str]:
    # The device count is fixed when JAX starts: run the example in a fresh process.
    source = f"""
        import json, runpy
        result = runpy.run_path({str(HERE / (stop.example + ".py"))!r})["main"]()
        print("TOUR-RESULT " + json.dumps(result))
    """
    out = quax.testing.run_on_simulated_devices(
        source, n=stop.devices, warnings_as_errors=False
    )
    lines = out.splitlines()
    print("\n".join(line for line in lines if not line.startswith("TOUR-RESULT ")))
    result = next(line for line in lines if line.startswith("TOUR-RESULT "))
    return json.loads(result.removeprefix("TOUR-RESULT "))


def run_stop(stop: Stop, out_dir: pathlib.Path) -> dict[str, str]:
    """Run one example's `main()`, giving it `out_dir` if it draws plots."""
    if stop.devices > 1:
        return _run_on_devices(stop)
    main = _load_main(stop.example)
    # The stops share this process: one that leaves float64 on would silently change
    # the dtypes, and so the figures, of every stop after it.
    x64 = jax.config.read("jax_enable_x64")
    if "out_dir" in inspect.signature(main).parameters:
        figures = main(out_dir=str(out_dir))
    else:
        figures = main()
    if jax.config.read("jax_enable_x64") != x64:
        raise RuntimeError(
            f"The tour stop {stop.example!r} changed jax_enable_x64 and left it so: "
            "restore it before main() returns, as examples/sparse_newton.py does."
        )
    return figures


def core_stop() -> dict[str, str]:
    """The core alone: symbolic zeros, and the installed families."""
    from quax.zero import Zero

    z = Zero((3,), jnp.float32)
    out = quax.quaxify(lambda a, b: a * b + b)(z, jnp.arange(3.0))
    print(f"Zero * x + x -> {out}")
    families = quax.plugins.summarise()
    for family in families:
        print(
            f"{family.name}: {family.distribution} {family.version}, "
            f"{family.num_rules} rules over {len(family.primitives)} primitives"
        )
    return {
        "Zero * x + x": str(out.tolist()),
        "families installed": ", ".join(f.name for f in families),
    }


def main(out_dir: str = "build/tour") -> dict[str, dict[str, str]]:
    out = pathlib.Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, str]] = {}
    timings: dict[str, str] = {}
    total = len(STOPS) + 1
    start = time.perf_counter()
    for i, (title, run) in enumerate(
        [("The core: symbolic zeros and the installed families", core_stop)]
        + [(stop.title, stop) for stop in STOPS],
        start=1,
    ):
        print(f"\n== [{i}/{total}] {title}", flush=True)
        t0 = time.perf_counter()
        if isinstance(run, Stop):
            missing = _missing(run)
            if missing:
                note = f"skipped: pip install {' '.join(missing)}"
                print(note)
                results[title] = {"status": note}
                timings[title] = "-"
                continue
            results[title] = run_stop(run, out)
        else:
            results[title] = run()
        timings[title] = f"{time.perf_counter() - t0:.0f} s"
        print(f"-- done in {timings[title]}", flush=True)

    print("\n## Summary\n")
    print("| stop | time | figures |")
    print("|---|---|---|")
    for title, figures in results.items():
        shown = "; ".join(f"{k}: {v}" for k, v in figures.items()).replace("|", "\\|")
        print(f"| {title} | {timings[title]} | {shown} |")
    print(f"\nTotal {time.perf_counter() - start:.0f} s.")
    plots = sorted(p.name for p in out.glob("*.png"))
    print(f"Plots written to {out}: {', '.join(plots) or 'none'}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A tour of quax and its families.")
    parser.add_argument("--out", default="build/tour", help="folder for the plots")
    main(parser.parse_args().out)
