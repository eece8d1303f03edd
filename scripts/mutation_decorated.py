"""Let mutmut mutate the functions that carry a decorator (`scripts/mutation.sh
--decorated`).

mutmut 3 never mutates a function with a decorator (other than a lone
`@staticmethod` or `@classmethod`), nested ones too: the decorator runs when the
function is defined, and mutmut's trampoline is put under it. Every rule defined
under `@quax.register(...)` is such a function. This script rewrites a module of
the copy that `scripts/mutation.sh` mutates (never the checkout) so that each such
function is a plain one, decorated by an assignment after it:

    @quax.register(lax.mul_p)            # line 40 of the module
    def _(x: Lora, y: ArrayLike, **params): ...

becomes

                                         # line 40, blank
    def _line_41(x: Lora, y: ArrayLike, **params): ...
    _line_41 = quax.register(lax.mul_p)(_line_41)  # pragma: no mutate

mutmut then puts its trampoline on `_line_41`, and the decorator registers the
trampoline: `functools.wraps` keeps the function's `__wrapped__`, so
`inspect.signature` (which plum dispatches on, and which `quax.register` reads the
keyword parameters from) sees the original signature and annotations, and its
`__module__` (which names a rule's owner). Each function named `_` (plum's idiom,
defined again and again), or whose name is defined more than once in its scope, is
renamed `_line_N`, after the line of its `def` in the module, so that each is a
function of its own to mutmut, and a mutant's name says where it is. The
assignment takes the blank line that follows the function (ruff's format leaves
two after a top-level one), so every line keeps its number; where no blank line
follows (a function nested in another, followed by a statement), the decorator's
lines are removed and the assignment put after the function, so that only that
function's own lines move up. The assignment is marked `# pragma: no mutate`, so
that the decorators themselves stay unmutated, as mutmut leaves them.

Methods of a class are left as they are (a `@property` setter could not be decorated
by an assignment after it).

    python scripts/mutation_decorated.py rewrite MODULE        # rewrite in place
    python scripts/mutation_decorated.py names MODULE RELATIVE # mutants inside them

`names` prints, one a line, mutmut's name of every mutant of the rewritten MODULE
that lies inside a function rewritten here (RELATIVE is the module's path as mutmut
names it, `src/...`), in mutmut's order.
"""

import ast
import itertools
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


MARK = "# pragma: no mutate"
_KEPT = ("staticmethod", "classmethod")


def _bodies(tree: ast.Module) -> Iterator[list[ast.stmt]]:
    """The statement lists in which a rewritten function may stand: the module's,
    and every function's (at any depth, within them their blocks too), but not a
    class's."""

    def walk(body: list[ast.stmt], in_class: bool) -> Iterator[list[ast.stmt]]:
        if not in_class:
            yield body
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield from walk(node.body, True)
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(node.body, False)
                continue
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    yield from walk(inner, in_class)
            for handler in getattr(node, "handlers", []):
                yield from walk(handler.body, in_class)
            for case in getattr(node, "cases", []):
                yield from walk(case.body, in_class)

    yield from walk(tree.body, False)


def _is_left_to_mutmut(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """No decorator, or one that mutmut handles itself."""
    decorators = node.decorator_list
    return not decorators or (
        len(decorators) == 1
        and isinstance(decorators[0], ast.Name)
        and decorators[0].id in _KEPT
    )


def _next_decorated(
    tree: ast.Module,
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, list[ast.stmt]] | None:
    """The decorated function (outside classes) whose `def` comes last, and the
    statement list it stands in."""
    found = None
    for body in _bodies(tree):
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if _is_left_to_mutmut(node):
                continue
            if found is None or node.lineno > found[0].lineno:
                found = (node, body)
    return found


def rewrite(source: str) -> tuple[str, int, int]:
    """The module with every decorated function (outside classes) decorated by an
    assignment after it; how many were rewritten, and of those how many had lines
    moved (no blank line after them)."""
    lines = source.splitlines(keepends=True)
    rewritten = moved = 0
    while True:
        tree = ast.parse("".join(lines))
        found = _next_decorated(tree)
        if found is None:
            return "".join(lines), rewritten, moved
        node, body = found
        names = Counter(
            n.name
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        )
        first = min(d.lineno for d in node.decorator_list)  # 1-based
        def_line = node.lineno
        name = node.name
        if name == "_" or names[name] > 1:
            # Named after its `def`'s line in the module as given: decorators
            # rewritten below it have not moved it, and those above come later.
            name = f"_line_{def_line}"
        indent = lines[first - 1][
            : len(lines[first - 1]) - len(lines[first - 1].lstrip())
        ]
        call = name
        for decorator in reversed(node.decorator_list):
            call = f"{ast.unparse(decorator)}({call})"
        assignment = f"{indent}{name} = {call}  {MARK}\n"
        end = node.end_lineno
        assert end is not None
        # The `def` line, renamed (the name follows `def ` or `async def `).
        header = lines[def_line - 1]
        keyword = "async def " if isinstance(node, ast.AsyncFunctionDef) else "def "
        start = header.index(keyword + node.name) + len(keyword)
        lines[def_line - 1] = header[:start] + name + header[start + len(node.name) :]
        decorator_lines = def_line - first
        if end < len(lines) and not lines[end].strip():
            # The blank line after the function takes the assignment; the
            # decorators' lines are left blank.
            lines[end] = assignment
            lines[first - 1 : def_line - 1] = ["\n"] * decorator_lines
        else:
            # The decorators' lines removed, as many put after the function.
            padding = ["\n"] * (decorator_lines - 1)
            lines[end:end] = [assignment, *padding]
            del lines[first - 1 : def_line - 1]
            moved += 1
        rewritten += 1


def _rewritten_spans(source: str) -> list[tuple[int, int]]:
    """The lines (first, last) of each function that `rewrite` made plain: a
    function followed, in its statement list, by the marked assignment of its
    decorators to its name."""
    tree = ast.parse(source)
    lines = source.splitlines()
    spans = []
    for body in _bodies(tree):
        for node, after in itertools.pairwise(body):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (
                isinstance(after, ast.Assign)
                and len(after.targets) == 1
                and isinstance(after.targets[0], ast.Name)
                and after.targets[0].id == node.name
                and lines[after.lineno - 1].rstrip().endswith(MARK)
            ):
                assert node.end_lineno is not None
                spans.append((node.lineno, node.end_lineno))
    return spans


def decorated_mutant_names(path: Path, relative: Path) -> list[str]:
    """mutmut's name of every mutant of the module at `path` (named by mutmut as
    `relative`) that lies inside a function that `rewrite` made plain."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import (
        MutationVisitor,
        group_by_top_level_node,
        mutate_file_contents,
    )
    from mutmut.mutation.mutators import mutation_operators
    from mutmut.mutation.pragma_handling import get_ignored_lines
    from mutmut.mutation.trampoline_templates import mangle_function_name
    from mutmut.utils.format_utils import get_mutant_name

    source = path.read_text()
    spans = _rewritten_spans(source)
    # As mutmut's `create_mutations`, keeping the positions of the mutated nodes.
    wrapper = MetadataWrapper(cst.parse_module(source))
    visitor = MutationVisitor(
        mutation_operators, get_ignored_lines(str(relative), source, wrapper)
    )
    module = wrapper.visit(visitor)
    positions = wrapper.resolve(PositionProvider)
    classes = {
        method: statement.name.value
        for statement in module.body
        if isinstance(statement, cst.ClassDef)
        and isinstance(statement.body, cst.IndentedBlock)
        for method in statement.body.body
    }
    names = []
    every = []
    # Named as mutmut's `function_trampoline_arrangement` names them.
    for function, mutations in group_by_top_level_node(visitor.mutations).items():
        if not isinstance(function, cst.FunctionDef):
            continue  # a statement of a class body other than a method: not mutated
        mangled = mangle_function_name(
            name=function.name.value, class_name=classes.get(function)
        )
        for i, mutation in enumerate(mutations):
            name = get_mutant_name(relative, f"{mangled}__mutmut_{i + 1}")
            every.append(name)
            line = positions[mutation.original_node].start.line
            if any(first <= line <= last for first, last in spans):
                names.append(name)
    # The same mutants as mutmut makes, by the same names.
    made = mutate_file_contents(str(relative), source).mutant_names
    assert sorted(every) == sorted(get_mutant_name(relative, n) for n in made)
    return names


def main() -> None:
    command, path = sys.argv[1], Path(sys.argv[2])
    if command == "rewrite":
        source, rewritten, moved = rewrite(path.read_text())
        path.write_text(source)
        print(
            f"{path}: {rewritten} decorated functions made plain "
            f"({moved} of them moved up by their decorators' lines)",
            file=sys.stderr,
        )
    elif command == "names":
        print("\n".join(decorated_mutant_names(path, Path(sys.argv[3]))))
    else:
        raise SystemExit(f"unknown command {command!r}: rewrite or names")


if __name__ == "__main__":
    main()
