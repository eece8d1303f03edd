"""The layout every family follows: its modules' roles, one-way imports between
them, and the core's materialisation policy.

A newcomer opening any family finds the same files in the same roles:

- values: `_value.py`, or a `_values/` package for several types: the value types
    and their errors;
- rules: `_rules.py`, or a `_rules/` package: every `quax.register` and
    `quax.register_elementwise`;
- kernels (optional): `_kernels.py`, or a `_kernels/` package: the numerical
    routines the rules call, on plain arrays;
- model (optional): `_model.py`: model-level helpers (`loraify`, `quantise_model`);
- nnx (optional): `_nnx.py`: the model helpers' work on Flax NNX models, which the
    model module calls (Flax stays optional: it never imports Flax);
- plugin: `_plugin.py`: the `quax.hookspecs` hooks, and no rules.

Other private modules (`_units.py`, say) support the values and rules; public
modules (`constants.py`) are API. Imports run one way: kernels import none of the
values, rules, model or plugin; the values and the supporting modules import none
of the rules, model or plugin; the rules do not import the model or the plugin; the
NNX module imports none of the rules, model or plugin; the model does not import the
plugin. No module but the plugin imports the family's own
top-level package, and no import cycle stands between the family's modules (imports
inside functions count: a deferred import hides a cycle, it does not break it).
"""

import ast
import importlib
import importlib.util
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from .._values._policy import GuardedValue, MaterialisationError
from .._values._value import Value


__all__ = ["assert_family_layout", "family_layout_problems"]

_ROLES = {
    "_value": "values",
    "_values": "values",
    "_rules": "rules",
    "_kernels": "kernels",
    "_model": "model",
    "_nnx": "nnx",
    "_plugin": "plugin",
}
# What each role may not import (by role).
_FORBIDDEN = {
    "kernels": {"values", "rules", "model", "plugin"},
    "values": {"rules", "model", "plugin"},
    "support": {"rules", "model", "plugin"},
    "rules": {"model", "plugin"},
    "nnx": {"rules", "model", "plugin"},
    "model": {"plugin"},
}
_REGISTER = {"register", "register_elementwise"}


def _role(module: str) -> str:
    """The role of the family's module `module` (relative, dotted: `_values._a`)."""
    if module == "__init__":
        return "init"
    first = module.split(".")[0]
    if first in _ROLES:
        return _ROLES[first]
    return "support" if first.startswith("_") else "public"


def _modules(root: Path) -> dict[str, Path]:
    """The family's modules by relative dotted name (`__init__` for the package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(
    package: str, module: str, path: Path, modules: dict[str, Path]
) -> Iterator[tuple[int, str]]:
    """(line, relative module) for every import of one of the family's modules (or
    of the package itself, `__init__`) anywhere in `module`'s source."""
    is_package = path.name == "__init__.py"
    own = [] if module == "__init__" else module.split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own[: len(own) - node.level + (1 if is_package else 0)]
                target = [package, *base, *(node.module or "").split(".")]
                target = ".".join(p for p in target if p)
            else:
                target = node.module or ""
            targets = [target, *(f"{target}.{a.name}" for a in node.names)]
        else:
            continue
        for target in targets:
            if target == package:
                yield node.lineno, "__init__"
            elif target.startswith(package + "."):
                relative = target[len(package) + 1 :]
                if relative in modules:
                    yield node.lineno, relative


def _registrations(path: Path) -> Iterator[int]:
    """The lines of `path` that call `quax.register` or `register_elementwise`."""
    tree = ast.parse(path.read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "quax"
        for alias in node.names
        if alias.name in _REGISTER
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in _REGISTER
            and isinstance(func.value, ast.Name)
            and func.value.id == "quax"
        ) or (isinstance(func, ast.Name) and func.id in imported):
            yield node.lineno


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one node (or a
    node importing itself): each holds an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def family_layout_problems(package: str | ModuleType) -> list[str]:
    """Every way the family `package` departs from the layout (see the module's
    docstring), one line each.

    **Arguments:**

    - `package`: the family's import package, or its name (`"quax_lora"`).

    **Returns:**

    A list of problems, empty when the family follows the layout.
    """
    module = (
        package if isinstance(package, ModuleType) else importlib.import_module(package)
    )
    name = module.__name__
    root = Path(inspect.getfile(module)).parent
    modules = _modules(root)
    problems = []
    roles = {_role(m) for m in modules}
    for role, files in (
        ("values", "`_value.py` or a `_values/` package"),
        ("rules", "`_rules.py` or a `_rules/` package"),
        ("plugin", "`_plugin.py`"),
    ):
        if role not in roles:
            problems.append(f"{name} has no {role} module: add {files}")
    if "_value" in modules and "_values" in modules:
        problems.append(f"{name} has both `_value.py` and `_values/`: keep one")
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for relative, path in modules.items():
        role = _role(relative)
        if role != "rules":
            for line in _registrations(path):
                problems.append(
                    f"{name}.{relative} (line {line}) registers a rule: every "
                    "`quax.register` belongs in the rules module (`_rules`)"
                )
        for line, target in _imports(name, relative, path, modules):
            if target == relative:
                continue
            if target == "__init__":
                if role not in ("plugin", "public", "init"):
                    problems.append(
                        f"{name}.{relative} (line {line}) imports the package "
                        f"`{name}` itself: import the module that defines the name"
                    )
                continue
            if role != "init":
                graph[relative].add(target)
            if _role(target) in _FORBIDDEN.get(role, ()):
                problems.append(
                    f"{name}.{relative} (line {line}) imports {name}.{target}: the "
                    f"{role} must not import the {_role(target)} (imports run "
                    "kernels <- values <- rules <- model <- plugin, and values <- "
                    "nnx <- model)"
                )
    for cycle in _cycles(graph):
        problems.append(
            f"{name} has an import cycle between " + ", ".join(f"`{m}`" for m in cycle)
        )
    problems.extend(_policy_problems(name, module))
    return problems


def _policy_problems(name: str, package: ModuleType) -> list[str]:
    """Error classes outside the core's base, and values with their own copy of
    the materialisation policy."""
    problems = []
    classes: dict[str, type] = {}
    for info in pkgutil.walk_packages(package.__path__, prefix=name + "."):
        submodule = importlib.import_module(info.name)
        for obj in vars(submodule).values():
            if isinstance(obj, type) and obj.__module__.startswith(name + "."):
                classes[f"{obj.__module__}.{obj.__qualname__}"] = obj
    for qualname, cls in sorted(classes.items()):
        if (
            issubclass(cls, BaseException)
            and "Materialis" in cls.__name__
            and not issubclass(cls, MaterialisationError)
        ):
            problems.append(
                f"{qualname} does not subclass `quax.MaterialisationError`: every "
                "family's refusal does, so that one `except` catches them all"
            )
        if (
            issubclass(cls, Value)
            and "enable_materialise" in vars(cls)
            and not issubclass(cls, GuardedValue)
        ):
            problems.append(
                f"{qualname} defines its own `enable_materialise`: subclass "
                "`quax.GuardedValue`, which holds the materialisation policy"
            )
    return problems


def assert_family_layout(package: str | ModuleType) -> None:
    """Check that the family `package` follows the layout every family shares: its
    modules in their roles (`_value.py` or `_values/`, `_rules.py`, `_kernels.py`,
    `_model.py`, `_nnx.py`, `_plugin.py`), every rule registered in the rules,
    imports that run one way with no cycle, and the core's materialisation policy
    ([`quax.GuardedValue`][], [`quax.MaterialisationError`][]).

    ```python
    def test_layout():
        quax.testing.assert_family_layout("quax_banded")
    ```

    **Arguments:**

    - `package`: the family's import package, or its name.

    **Returns:**

    Nothing; raises `AssertionError` listing every problem.
    """
    problems = family_layout_problems(package)
    if problems:
        raise AssertionError(
            "The family does not follow quax's family layout:\n- "
            + "\n- ".join(problems)
        )
