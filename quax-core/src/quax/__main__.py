"""`python -m quax`: list installed families, explain a dispatch, report what a
program materialises."""

import argparse
import importlib
import sys
from collections.abc import Sequence

import jax

from . import _plugins
from ._introspect import primitive_named, summarise
from ._registry import resolve
from ._values import track_materialisation


def _families(_: argparse.Namespace) -> int:
    rows = summarise()
    if not rows:
        print("No quax family is installed.")
        return 0
    for row in rows:
        print(f"{row.name}: {row.distribution} {row.version} [{row.state}]")
        if row.error:
            print(f"  error: {row.error}")
        print(f"  value types: {', '.join(row.value_types) or '-'}")
        print(f"  rules: {row.num_rules} over {len(row.primitives)} primitives")
        if row.primitives:
            print(f"  primitives: {', '.join(row.primitives)}")
    return 0


def _type_named(name: str) -> type:
    if name in ("array", "Array", "jax.Array"):
        return jax.Array
    if ":" in name:
        module, _, qualname = name.partition(":")
        obj: object = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        assert isinstance(obj, type)
        return obj
    for family in _plugins.families():
        for t in _plugins.value_types(family):
            if t.__qualname__ == name:
                return t
    if name == "Zero":
        from .zero import Zero

        return Zero
    raise SystemExit(
        f"Unknown type {name!r}: use `array`, a value type of an installed family, or "
        "`module:QualName`."
    )


def _explain(args: argparse.Namespace) -> int:
    _plugins.load()
    primitive = primitive_named(args.primitive)
    types = [_type_named(t) for t in args.types]
    resolution = resolve(primitive, types)
    names = ", ".join(t.__qualname__ for t in types)
    print(f"{primitive.name}({names}) -> {resolution.kind}: {resolution.reason}")
    return 0


def _materialised(args: argparse.Namespace) -> int:
    module, _, name = args.target.partition(":")
    sys.path.insert(0, ".")
    fn = getattr(importlib.import_module(module), name)
    _plugins.autoload()
    with track_materialisation() as report:
        fn()
    print(report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line. **Returns:** the exit status."""
    parser = argparse.ArgumentParser(prog="python -m quax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("families", help="list installed families").set_defaults(
        run=_families
    )
    explain = sub.add_parser(
        "explain", help="which rule a primitive resolves to, and why"
    )
    explain.add_argument("primitive", help="primitive name, e.g. dot_general")
    explain.add_argument(
        "types", nargs="+", help="input types: array, LoraArray, module:QualName"
    )
    explain.set_defaults(run=_explain)
    mat = sub.add_parser(
        "materialised",
        help="run MODULE:FUNCTION (no arguments) and report materialisations",
    )
    mat.add_argument("target")
    mat.set_defaults(run=_materialised)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
