"""Every benchmark in one command.

    python benchmarks/run.py [--quick | --full] [--[no-]published] [--only NAME ...]
                             [--json PATH]

Imports each `benchmarks/<name>.py`, runs its `main(quick=...)` (each prints its own
Markdown tables and draws its plots to `docs/images/<name>_*.png`), then prints one
table of the ratios measured in this run and writes the raw figures as JSON, with the
date, machine and versions, to `benchmarks/results/<date>.json` (or `--json PATH`).
`--quick` takes about a minute per benchmark on a CPU; `--full` (the default) gives the
figures of the READMEs. A benchmark that fails is reported and the others still run;
the exit status is then 1.

The published quax 0.4.6 runs side by side (`published.py`, and `core.py`'s published
column) in its own environment, `build/published-quax/`, installed with uv from
`benchmarks/published-requirements.txt` and reused while that file is unchanged; its
interpreter reaches the benchmarks as `QUAX_PUBLISHED_PYTHON` (set it yourself to use
another). `--full` builds the environment when it is missing (this needs PyPI) and
fails if it cannot; `--quick` only reuses it, and says so when it is missing, unless
`--published` is given; `--no-published` leaves the published quax out.
"""

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any


HERE = pathlib.Path(__file__).resolve().parent
IMAGES = HERE.parent / "docs" / "images"
PUBLISHED_REQUIREMENTS = HERE / "published-requirements.txt"
PUBLISHED_VENV = HERE.parent / "build" / "published-quax"
# The benchmarks that measure the published quax when `QUAX_PUBLISHED_PYTHON` is set.
_WITH_PUBLISHED = ("core", "published")
# Keys of the returned figures that hold a ratio (or a fitted exponent), by substring.
_RATIO_WORDS = ("ratio", "/", "_vs_", " vs ", "speedup", "exponent", "slope")
_DISTRIBUTIONS = (
    "jax",
    "jaxlib",
    "equinox",
    "quax-core",
    "quax-lora",
    "quax-units",
    "quax-sparse",
    "quax-structured",
    "quax-quant",
    "quax-named",
    "lineax",
    "optax",
)


def discover(directory: pathlib.Path = HERE) -> list[str]:
    """The benchmark names: every `<name>.py` of `directory` but this runner."""
    return sorted(
        p.stem
        for p in directory.glob("*.py")
        if p.name != pathlib.Path(__file__).name and not p.name.startswith("_")
    )


def _load(name: str, directory: pathlib.Path):
    path = directory / f"{name}.py"
    # The benchmarks' shared modules (`_clocks.py`) beside them, importable as when
    # a benchmark runs as a script.
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    spec = importlib.util.spec_from_file_location(f"quax_benchmark_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _jsonable(x: Any) -> Any:
    """`x` with numbers as Python floats/ints, tuples as lists, keys as strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool | int | str) or x is None:
        return x
    try:
        value = float(x)
    except (TypeError, ValueError):
        return str(x)
    return value if math.isfinite(value) else str(value)


def ratios(figures: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """The (key path, value) pairs of `figures` whose key names a ratio."""
    if isinstance(figures, dict):
        for key, value in figures.items():
            sub = f"{path}.{key}" if path else str(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if any(w in str(key).lower() for w in _RATIO_WORDS):
                    yield sub, float(value)
            else:
                yield from ratios(value, sub)
    elif isinstance(figures, list):
        for i, value in enumerate(figures):
            label = (
                value.get("n", value.get("size", i)) if isinstance(value, dict) else i
            )
            yield from ratios(value, f"{path}[{label}]")


def environment() -> dict[str, Any]:
    """Date, machine and versions, for the JSON."""
    versions = {}
    for dist in _DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    import jax

    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "jax backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
        },
        "python": platform.python_version(),
        "versions": versions,
    }


def published_python(
    *,
    build: bool,
    venv: pathlib.Path = PUBLISHED_VENV,
    requirements: pathlib.Path = PUBLISHED_REQUIREMENTS,
) -> tuple[str | None, str]:
    """The interpreter of the published quax's own environment.

    **Arguments:**

    - `build`: whether to (re)build the environment with uv when `venv` is missing or
      was built from other requirements (this needs PyPI).
    - `venv`: where the environment is kept.
    - `requirements`: the exact versions to install; a copy of the file in `venv`
      marks what it was built from.

    **Returns:**

    `(python, how)`: the interpreter's path and how it was found, or `None` and why
    there is none. A build that fails raises `RuntimeError` with uv's output.
    """
    python = venv / "bin" / "python"
    stamp = venv / requirements.name
    wanted = requirements.read_text()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python), f"reused {venv}"
    if not build:
        state = "is missing" if not python.exists() else "is out of date"
        return None, (
            f"the published quax's environment {venv} {state}; "
            "`--published` (or `--full`) builds it, which needs PyPI"
        )
    uv = shutil.which("uv")
    if uv is None:
        raise RuntimeError("building the published quax's environment needs uv")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    install = ["install", "--quiet", "--python", str(python), "-r", str(requirements)]
    for command in (
        [uv, "venv", "--quiet", "--clear", "--python", version, str(venv)],
        [uv, "pip", *install],
    ):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"building {venv} failed: {' '.join(command[1:3])}: {done.stderr}"
            )
    stamp.write_text(wanted)
    return str(python), f"built {venv}"


def _published_environment(
    names: Sequence[str], published: bool | None, quick: bool, venv: pathlib.Path
) -> dict[str, Any]:
    """Where the published quax runs: `python` (or `None`) and `how`, or `error`."""
    if not set(names) & set(_WITH_PUBLISHED):
        return {"python": None, "how": "no benchmark here measures it"}
    given = os.environ.get("QUAX_PUBLISHED_PYTHON")
    if given:
        return {"python": given, "how": "QUAX_PUBLISHED_PYTHON"}
    if published is False:
        return {"python": None, "how": "left out (--no-published)"}
    build = bool(published) or not quick
    try:
        python, how = published_python(build=build, venv=venv)
    except RuntimeError as e:
        return {"python": None, "error": str(e)}
    return {"python": python, "how": how}


def run(
    names: Sequence[str] | None = None,
    *,
    quick: bool = False,
    json_path: pathlib.Path | None = None,
    directory: pathlib.Path = HERE,
    images: pathlib.Path = IMAGES,
    published: bool | None = None,
    published_venv: pathlib.Path = PUBLISHED_VENV,
) -> dict[str, Any]:
    """Run the benchmarks `names` (all by default) and write their figures.

    **Arguments:**

    - `names`: benchmark names (files of `directory` without `.py`).
    - `quick`: passed to each `main(quick=...)`.
    - `json_path`: where to write the raw figures (default
      `benchmarks/results/<date>.json`).
    - `directory`: where the benchmarks are.
    - `images`: where the benchmarks write their plots (to list the new ones).
    - `published`: whether to measure the published quax: `True` builds its
      environment if needed, `False` leaves it out, `None` (the default) builds it in
      full mode and only reuses it in quick mode.
    - `published_venv`: where its environment is kept.

    **Returns:**

    The dict written as JSON: `environment`, `mode`, `published` (its interpreter
    and how it was found, or why it was not measured), and per benchmark its
    `figures` (what its `main` returned), `seconds`, or its `error`.
    """
    names = list(names) if names else discover(directory)
    unknown = sorted(set(names) - set(discover(directory)))
    if unknown:
        raise SystemExit(
            f"unknown benchmark(s) {', '.join(unknown)}; "
            f"available: {', '.join(discover(directory))}"
        )
    started = time.time()
    results: dict[str, Any] = {
        "environment": environment(),
        "mode": "quick" if quick else "full",
        "published": _published_environment(names, published, quick, published_venv),
        "benchmarks": {},
    }
    side = results["published"]
    if side.get("python"):
        print(f"published quax: {side['python']} ({side['how']})")
    else:
        print(f"published quax not measured: {side.get('error', side.get('how'))}")
    saved = os.environ.get("QUAX_PUBLISHED_PYTHON")
    if side.get("python"):
        os.environ["QUAX_PUBLISHED_PYTHON"] = side["python"]
    try:
        _run_each(names, directory, quick, results)
    finally:
        if saved is None:
            os.environ.pop("QUAX_PUBLISHED_PYTHON", None)
    _print_ratios(results)
    plots = sorted(
        str(p.relative_to(images.parent.parent))
        if images.parent.parent in p.parents
        else str(p)
        for p in images.glob("*.png")
        if p.stat().st_mtime >= started
    )
    results["plots"] = plots
    if json_path is None:
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
        json_path = directory / "results" / f"{stamp}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nPlots drawn in this run: {', '.join(plots) or 'none'}")
    print(f"Raw figures: {json_path}")
    return results


def _run_each(
    names: Sequence[str], directory: pathlib.Path, quick: bool, results: dict
) -> None:
    for i, name in enumerate(names, start=1):
        print(f"\n# [{i}/{len(names)}] benchmarks/{name}.py", flush=True)
        t0 = time.perf_counter()
        entry: dict[str, Any] = {}
        try:
            main = _load(name, directory).main
            if "quick" in inspect.signature(main).parameters:
                figures = main(quick=quick)
            else:
                figures = main()
                entry["note"] = "main() takes no `quick`: it ran in its one mode"
            if figures is None:
                entry["note"] = "main() returned no figures (see its printed tables)"
            entry["figures"] = _jsonable(figures)
        except Exception as e:
            traceback.print_exc()
            entry["error"] = f"{type(e).__name__}: {e}"
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        results["benchmarks"][name] = entry


def _print_ratios(results: dict[str, Any]) -> None:
    print("\n## Ratios measured in this run\n")
    print(f"{results['environment']['date']}, {results['mode']} mode, ", end="")
    machine = results["environment"]["machine"]
    print(
        f"{machine['processor']} ({machine['cpus']} CPUs, {machine['jax backend']})\n"
    )
    print("| benchmark | figure | value |")
    print("|---|---|---|")
    side = results["published"]
    if "error" in side:
        print(f"| published quax | failed | {side['error'][:80]} |")
    elif not side.get("python") and set(results["benchmarks"]) & set(_WITH_PUBLISHED):
        print(f"| published quax | not measured | {side['how']} |")
    for name, entry in results["benchmarks"].items():
        if "error" in entry:
            print(f"| {name} | failed | {entry['error'][:80]} |")
            continue
        found = list(ratios(entry.get("figures")))
        if not found:
            print(f"| {name} | (no ratio among its figures) | |")
        for key, value in found:
            print(f"| {name} | {key.replace('|', '/')} | {value:.3g} |")


def _cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run every benchmark; one table of ratios, raw figures as JSON."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="about a minute each")
    mode.add_argument("--full", action="store_true", help="the default")
    parser.add_argument(
        "--published",
        action=argparse.BooleanOptionalAction,
        help="measure the published quax 0.4.6 in its own environment, building it "
        "if needed (default: in --full; in --quick only if already built)",
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks")
    parser.add_argument("--json", type=pathlib.Path, help="where to write the figures")
    args = parser.parse_args(argv)
    results = run(
        args.only, quick=args.quick, json_path=args.json, published=args.published
    )
    failed = [n for n, e in results["benchmarks"].items() if "error" in e]
    return 1 if failed or "error" in results["published"] else 0


if __name__ == "__main__":
    sys.exit(_cli())
