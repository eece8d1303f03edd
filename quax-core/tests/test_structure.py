"""The core's structure: its imports run one way, it knows no family, `_compat`
holds only access to JAX's and equinox's private API (and the two names clients of
the published quax import from it), and `quax.<unknown>` fails at once."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import quax
from packaging.version import Version


# The core's structure (its source tree, and imports in subprocesses): its subject is
# the layering, not the caches; so they run in the normal mode only (scripts/test.sh),
# not in the cache verify mode run.
pytestmark = pytest.mark.normal_mode_only


SOURCE = Path(quax.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement of `module` names (absolute)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        is_package = MODULES[module].name == "__init__.py"
        parts = module.split(".")
        base = parts[: len(parts) - node.level + (1 if is_package else 0)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    # `from package import submodule` imports the submodule.
    subs = [f"{target}.{alias.name}" for alias in node.names]
    return [target, *(s for s in subs if s in MODULES)]


def _imports(module: str) -> tuple[set[str], list[tuple[int, str]]]:
    """The quax modules `module` imports at its top level, and every import
    statement inside a function or class body (line, module)."""
    tree = ast.parse(MODULES[module].read_text())
    top: set[str] = set()
    nested: list[tuple[int, str]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for name in _imported(module, child):
                    if inside:
                        nested.append((child.lineno, name))
                    else:
                        top.add(name)
            visit(
                child,
                inside
                or isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                ),
            )

    visit(tree, False)
    return top, nested


def _run_time_imports(module: str, source: str | None = None) -> list[tuple[int, str]]:
    """The modules `module` (or `source`, as if it were that module's) imports at run
    time by name, with `importlib.import_module("name"[, __package__])` or
    `__import__("name")`, where the name is a literal: (line, absolute name)."""
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    is_package = module in MODULES and MODULES[module].name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func, first = node.func, node.args[0]
        named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
            isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
        )
        if not (named and isinstance(first, ast.Constant)):
            continue
        name = first.value
        if not isinstance(name, str):
            continue
        if name.startswith("."):
            rest = name.lstrip(".")
            level = len(name) - len(rest)
            base = package.rsplit(".", level - 1)[0] if level > 1 else package
            name = f"{base}.{rest}" if rest else base
        found.append((node.lineno, name))
    return found


def test_core_imports_run_one_way() -> None:
    graph = {}
    for module in MODULES:
        top, nested = _imports(module)
        own_nested = [
            (line, name)
            for line, name in nested
            if name == "quax" or name.startswith("quax.")
        ]
        assert not own_nested, (
            f"{module} imports quax's own modules inside a function: {own_nested}"
        )
        families = [n for n in top | {n for _, n in nested} if n.startswith("quax_")]
        assert not families, f"{module} imports a family: {families}"
        # A module's own parent packages are being imported already: not an edge.
        graph[module] = {
            n
            for n in top
            if n in MODULES and n != module and not module.startswith(n + ".")
        }
    # Depth-first search for a cycle.
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_import_walk_finds_a_cycle_and_a_nested_import(tmp_path: Path) -> None:
    # The walk itself: a nested import and a relative import are seen as such.
    top, nested = _imports("quax._transform._trace")
    assert "quax._compat" in top and "quax._dispatch._registry" in top
    assert nested == []
    assert "quax._transform._quaxify" in _imports("quax.zero._rules")[0]


# The core's layers, lowest first. A layer is a subpackage of `quax` (its docstring
# says what the layer owns); the few modules whose paths are public stay at the top
# and are named here with their layer. A module imports only modules of its own layer
# or of the layers below it (`docs/architecture.md` draws them). A module holds one
# concept, however long; this test, not a line count, keeps the core's shape.
LAYERS: dict[str, set[str]] = {
    # What every layer may use: the cache tables and their switch, the registration
    # journal, the rules' owners, tables of primitives, the published-quax shadow
    # check, the version; and JAX's private API, at `quax._compat` (the path the
    # published quax's clients import it from).
    "foundation": {"_foundation", "_compat"},
    # The values quax dispatches on, their avals and the materialisation policy; and
    # the hooks a family implements (`quax.hookspecs`).
    "values": {"_values", "hookspecs"},
    # Rules and how they are found: the registry, values staged inside a program,
    # what a rule can know of a plain operand at trace time (`quax.known_constant`),
    # and the plugin loader (which `quaxify` runs on its first call).
    "dispatch": {"_dispatch"},
    # What quax keeps between binds and calls: the one key builder, compiled eager
    # programs, what is worked out once per jaxpr, the recordings replayed while a
    # program is staged. (The tables themselves, `_foundation/_caches.py`, are a
    # foundation.)
    "caches": {"_caching"},
    # The transform itself, and the jaxpr interpreter that binds a staged body's
    # equations on it.
    "transform": {"_transform"},
    # Rules for first-order primitives on every value, whatever its family.
    "first-order rules": {"_first_order"},
    # Rules for higher-order primitives, and the built-in symbolic zeros family
    # (`quax.zero`).
    "higher-order rules": {"_rules", "zero"},
    # What users and families call on top: the public modules, introspection, the
    # conformance kit and the command line.
    "interface": {
        "__init__",
        "__main__",
        "plugins",
        "extend",
        "_introspect",
        "_select",
        "examples",
        "testing",
    },
}


def _layer_of(module: str) -> int:
    """The index in `LAYERS` of `quax.<module>`: the layer of its subpackage (or
    top-level module) below `quax` (`quax` itself is `__init__`)."""
    name = module.split(".")[1] if "." in module else "__init__"
    for index, members in enumerate(LAYERS.values()):
        if name in members:
            return index
    raise AssertionError(
        f"{module} is in no layer: move it into the subpackage of the lowest layer "
        "whose modules it needs (a new top-level module or subpackage goes into "
        "`LAYERS` in this test), and name it in docs/architecture.md"
    )


def test_layers_import_only_layers_below() -> None:
    names = list(LAYERS)
    upward = []
    for module in MODULES:
        own = _layer_of(module)
        top, _ = _imports(module)
        # A module imported by name at run time is an import as well.
        top |= {name for _, name in _run_time_imports(module)}
        for dep in sorted(top):
            if dep in MODULES and dep != "quax" and _layer_of(dep) > own:
                upward.append(
                    f"{module} ({names[own]}) imports {dep} ({names[_layer_of(dep)]})"
                )
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_layer_walk_names_an_upward_import() -> None:
    # The walk itself: `_trace` (transform) imports `_replay` (caches), which is
    # below it; the reverse would be reported.
    assert "quax._caching._replay" in _imports("quax._transform._trace")[0]
    assert _layer_of("quax._caching._replay") < _layer_of("quax._transform._trace")
    assert _layer_of("quax.zero._rules") == list(LAYERS).index("higher-order rules")
    assert _layer_of("quax._compat") == 0
    with pytest.raises(AssertionError, match="is in no layer"):
        _layer_of("quax._nowhere")
    with pytest.raises(AssertionError, match="is in no layer"):
        _layer_of("quax._nowhere._module")
    # A run-time import by name (relative to `__package__`, or absolute) is seen too:
    # a lower layer reaching up that way would be reported.
    reach_up = textwrap.dedent(
        """
        import importlib

        def flag():
            trace = importlib.import_module(".._transform._trace", __package__)
            return trace, __import__("quax._rules._joins")
        """
    )
    found = _run_time_imports("quax._values._avals", reach_up)
    assert found == [(5, "quax._transform._trace"), (6, "quax._rules._joins")]
    assert all(_layer_of(name) > _layer_of("quax._values._avals") for _, name in found)
    assert _run_time_imports("quax.zero._plugin") == [
        (16, "quax.zero._rules"),
        (26, "quax.zero"),
    ]


def test_every_layer_package_says_what_it_owns() -> None:
    packages = [
        name
        for members in LAYERS.values()
        for name in members
        if name.startswith("_") and (SOURCE / name / "__init__.py").exists()
    ]
    assert len(packages) == 7
    for name in packages:
        doc = ast.get_docstring(ast.parse((SOURCE / name / "__init__.py").read_text()))
        assert doc and "layer" in doc, f"quax.{name} has no docstring naming its layer"


def test_architecture_page_names_every_module() -> None:
    page = (SOURCE.parents[2] / "docs" / "architecture.md").read_text()
    missing = [
        m
        for m, p in MODULES.items()
        if p.name != "__init__.py"
        and f"`{p.relative_to(SOURCE).as_posix()}`" not in page
    ]
    assert not missing, f"docs/architecture.md does not name {missing}"


def _compat_tree() -> ast.Module:
    return ast.parse((SOURCE / "_compat.py").read_text())


def test_compat_imports_are_at_the_top() -> None:
    tree = _compat_tree()
    body = tree.body
    kinds = [isinstance(n, ast.Import | ast.ImportFrom) for n in body]
    first_other = next(
        i
        for i, (n, k) in enumerate(zip(body, kinds, strict=True))
        if not k and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    )
    assert not any(kinds[first_other:]), "an import below other statements"
    nested = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom) and n not in body
    ]
    assert nested == [], f"imports inside functions at lines {nested}"


def test_compat_all_is_exact() -> None:
    from quax import _compat

    defined = set()
    for node in _compat_tree().body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "jax._src"
        ):
            defined |= {a.asname or a.name for a in node.names}
    public = {name for name in defined if not name.startswith("_")}
    assert sorted(_compat.__all__) == sorted(public)
    assert len(_compat.__all__) == len(set(_compat.__all__))
    for name in _compat.__all__:
        assert hasattr(_compat, name)


def test_compat_has_the_published_names() -> None:
    # quaxed's tests import these two from `quax._compat`, as from the published quax.
    from quax._compat import JAX_VERSION, typeof

    assert isinstance(JAX_VERSION, Version)
    assert Version(jax.__version__) == JAX_VERSION
    assert Version("0.10") <= JAX_VERSION  # as quaxed's tests compare it
    aval = typeof(jnp.ones((2, 3), jnp.float32))
    assert aval.shape == (2, 3) and aval.dtype == jnp.float32
    assert typeof(1.0).weak_type


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {
        **{k: v for k, v in os.environ.items() if k != "QUAX_DISABLE_PLUGIN_AUTOLOAD"},
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(
        [sys.executable, *args, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_unknown_attribute_loads_no_family() -> None:
    result = _python(
        """
        import json, sys, quax
        from quax import plugins
        missing = hasattr(quax, "no_such_name")
        try:
            quax.no_such_name
        except AttributeError as e:
            error = str(e)
        print(json.dumps({
            "missing": missing,
            "error": error,
            "loaded": [f.name for f in plugins.families()
                       if f.state == "loaded" and f.name != "zero"],
            "modules": [m for m in sys.modules if m.startswith("quax_")],
            "zero": quax.zero.Zero.__name__,
        }))
        """
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["missing"] is False
    assert out["error"] == "module 'quax' has no attribute 'no_such_name'"
    assert out["loaded"] == [] and out["modules"] == []
    assert out["zero"] == "Zero"


def test_symbolic_zeros_are_a_builtin_family() -> None:
    from quax._dispatch import _plugins

    (zero,) = [f for f in quax.plugins.families() if f.name == "zero"]
    assert zero.builtin and zero.state == "loaded"
    assert zero.distribution == "quax-core"
    assert _plugins.value_types(zero) == [quax.zero.Zero]
    assert _plugins.example_module("zero") is quax.zero
    (summary,) = [s for s in quax.plugins.summarise() if s.name == "zero"]
    assert summary.value_types == ("Zero",)
    # Only the zeros' own rules count, not the core's higher-order ones.
    assert "mul" in summary.primitives and "while" not in summary.primitives


def test_loop_bodies_tried_per_thread() -> None:
    # A loop body being tried in one thread does not change how another thread's
    # loops report a failing body.
    import threading

    from quax._rules import _joins

    seen = []
    with _joins.catching():
        thread = threading.Thread(target=lambda: seen.append(_joins.trying()))
        thread.start()
        thread.join()
        assert _joins.trying()
    assert seen == [False]
    assert not _joins.trying()


def test_run_nested_checks_for_leaks() -> None:
    from quax._transform import _trace

    kept = []

    def body(trace: _trace.QuaxTrace) -> int:
        kept.append(trace.wrap(quax.zero.Zero((2,), jnp.float32)))  # a leaked tracer
        return 1

    with jax.check_tracer_leaks(True), pytest.raises(Exception, match=r"[Ll]eak"):
        _trace.run_nested(body)
    kept.clear()


def test_track_evaluations_counts_bodies() -> None:
    x = quax.zero.Zero((3,), jnp.float32)

    def f(x: object) -> object:
        return jax.lax.cond(True, lambda c: c * 2, lambda c: c * 3, x)

    with quax.plugins.track_evaluations() as report:
        quax.quaxify(f)(x)
    assert report.total >= 2  # one evaluation per branch at least
    with quax.plugins.track_evaluations() as again:
        pass
    assert again.total == 0
