"""`python -m quax`: list installed families, explain a dispatch, report what a
program materialises, report the caches' sizes."""

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

import jax

from ._dispatch import _plugins
from ._dispatch._registry import Resolution, resolve
from ._foundation import _caches
from ._foundation._shadow import shadowing_message
from ._introspect import primitive_named, summarise
from ._values._policy import GuardedValue
from ._values._value import track_materialisation


class _UsageError(Exception):
    """A wrong command line: reported in one line, with exit status 2."""


def _families(_: argparse.Namespace) -> int:
    shadowed = shadowing_message()
    if shadowed is not None:
        print(f"warning: {shadowed}\n")
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
        try:
            obj: object = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise _UsageError(f"cannot find the type {name!r}: {e}") from e
        if not isinstance(obj, type):
            raise _UsageError(f"{name!r} is not a type")
        return obj
    for family in _plugins.families():
        for t in _plugins.value_types(family):
            if t.__qualname__ == name:
                return t
    raise _UsageError(
        f"unknown type {name!r}: use `array`, a value type of an installed family, "
        "or `module:QualName`"
    )


def _refusal_note(resolution: Resolution, types: Sequence[type]) -> str:
    """What the default does where it materialises a type that refuses to, unless
    allowed: a type following the materialisation policy, `quax.GuardedValue`."""
    if resolution.kind == "rule":
        return ""
    refusing = [
        t.__qualname__
        for t in dict.fromkeys(types)
        if isinstance(t, type) and issubclass(t, GuardedValue)
    ]
    if not refusing:
        return ""
    return (
        f"; {', '.join(refusing)} refuses to materialise unless "
        "allow_materialise=True (or `.enable_materialise()`)"
    )


def _explain(args: argparse.Namespace) -> int:
    _plugins.load()
    # The types first: a `module:QualName` type's module may register rules.
    types = [_type_named(t) for t in args.types]
    try:
        primitive = primitive_named(args.primitive)
    except LookupError as e:
        raise _UsageError(str(e)) from e
    try:
        resolution = resolve(primitive, types)
    except TypeError as e:  # ambiguous rules, or two types overriding `default`
        raise _UsageError(str(e)) from e
    names = ", ".join(t.__qualname__ for t in types)
    print(
        f"{primitive.name}({names}) -> {resolution.kind}: {resolution.reason}"
        f"{_refusal_note(resolution, types)}"
    )
    return 0


def _target(target: str) -> Callable[[], object]:
    module, colon, name = target.partition(":")
    if not colon or not module or not name:
        raise _UsageError(f"expected MODULE:FUNCTION, got {target!r}")
    sys.path.insert(0, ".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise _UsageError(f"cannot load {target!r}: {e}") from e
    if not callable(fn):
        raise _UsageError(f"{target!r} is not callable")
    return fn


def _materialised(args: argparse.Namespace) -> int:
    fn = _target(args.target)
    _plugins.autoload()
    with track_materialisation() as report:
        fn()
    print(report)
    return 0


def _caches_report(args: argparse.Namespace) -> int:
    if args.target is not None:
        fn = _target(args.target)
        _plugins.autoload()
        fn()
    state = (
        "on" if _caches.is_enabled() else "off (quax.caching(False) or QUAX_CACHING=0)"
    )
    verify = "on" if _caches.verifying else "off"
    print(f"caches: {state}; verify mode (QUAX_VERIFY_CACHES=1): {verify}")
    for name, size, bound in _caches.report():
        print(f"  {name}: {size} of at most {bound}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line. **Returns:** the exit status (2 for a wrong command
    line, reported in one line on stderr)."""
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
    caches = sub.add_parser(
        "caches",
        help="report each cache's size and bound (after running MODULE:FUNCTION)",
    )
    caches.add_argument("target", nargs="?", default=None)
    caches.set_defaults(run=_caches_report)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (_UsageError, Warning) as e:
        # A `Warning` is raised where warnings are errors: a rule conflict between
        # two families, or a family that fails to load.
        message = " ".join(str(e).split())
        print(f"python -m quax {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
