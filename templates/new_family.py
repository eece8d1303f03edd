"""Generate a new quax family from `templates/family/` and add it to the workspace.

```
python templates/new_family.py banded            # creates quax-banded/ in this repo
python templates/new_family.py banded --dest DIR  # in another workspace (or folder)
```

It writes `DIR/quax-NAME/` (distribution `quax-NAME`, package `quax_NAME`, entry
point `NAME`, value type `NameArray` and its error `NameMaterialisationError`),
then adds the family to `DIR/pyproject.toml` where that is a uv workspace root: the
root project's dependencies, the workspace members, `[tool.uv.sources]`, and
pyright's `include` (its sources and tests). It is idempotent: files that
exist are kept, entries that exist are not repeated. Then run `uv lock && uv sync`.
"""

import argparse
import keyword
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path


TEMPLATE = Path(__file__).resolve().parent / "family"
# Every distribution ships the project's licence text beside its metadata.
LICENSE = TEMPLATE.parent.parent / "LICENSE"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Names:
    """The names a family `name` is known by."""

    name: str  # entry point, `quax.examples.<name>`
    dist: str  # distribution, `quax-<name>` with dashes
    package: str  # import package, `quax_<name>`
    value: str  # the template's value type, `<Name>Array`
    error: str  # its refusal, `<Name>MaterialisationError`

    @classmethod
    def of(cls, name: str) -> "Names":
        if not _NAME.match(name) or keyword.iskeyword(name):
            raise ValueError(
                f"a family name is a lowercase Python identifier (letters, digits, "
                f"underscores, starting with a letter); got {name!r}"
            )
        camel = "".join(part.capitalize() for part in name.split("_"))
        dist = f"quax-{name.replace('_', '-')}"
        error = f"{camel}MaterialisationError"
        return cls(name, dist, f"quax_{name}", f"{camel}Array", error)

    def substitute(self, text: str) -> str:
        for key, value in (
            ("name", self.name),
            ("dist", self.dist),
            ("package", self.package),
            ("Value", self.value),
            ("Error", self.error),
        ):
            text = text.replace("{{" + key + "}}", value)
        leftover = re.search(r"\{\{\w+\}\}", text)
        if leftover:
            raise ValueError(f"unknown template placeholder {leftover.group()}")
        return text


def generate(names: Names, dest: Path) -> list[Path]:
    """Write the family into `dest/<dist>/`; returns the files written (existing
    files are kept as they are)."""
    root = dest / names.dist
    written = []
    for source in sorted(TEMPLATE.rglob("*")):
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        relative = names.substitute(str(source.relative_to(TEMPLATE)))
        target = root / relative.removesuffix(".tmpl")
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(names.substitute(source.read_text()))
        written.append(target)
    licence = root / "LICENSE"
    if not licence.exists():
        licence.write_text(LICENSE.read_text())
        written.append(licence)
    return written


def _section(text: str, header: str) -> tuple[int, int]:
    """The character span of the body of the TOML table `[header]`."""
    match = re.search(rf"^\[{re.escape(header)}\][ \t]*$", text, re.MULTILINE)
    if match is None:
        raise ValueError(f"the root pyproject has no [{header}] table")
    end = re.search(r"^\[", text[match.end() :], re.MULTILINE)
    return match.end(), len(text) if end is None else match.end() + end.start()


def _add_to_array(text: str, header: str, key: str, item: str) -> str:
    """Add `"item",` at the end of the multi-line array `key = [...]` of `[header]`."""
    start, stop = _section(text, header)
    body = text[start:stop]
    match = re.search(
        rf"^{re.escape(key)}\s*=\s*\[(.*?)^\]", body, re.MULTILINE | re.DOTALL
    )
    if match is None:
        raise ValueError(f"[{header}] has no multi-line array {key} = [...]")
    insert = start + match.end() - 1  # before the closing bracket
    return text[:insert] + f'    "{item}",\n' + text[insert:]


def _add_line(text: str, header: str, line: str) -> str:
    """Add `line` at the end of the table `[header]` (before its blank lines)."""
    start, stop = _section(text, header)
    body = text[start:stop]
    kept = body.rstrip("\n")
    return text[:start] + kept + "\n" + line + body[len(kept) :] + text[stop:]


def add_to_workspace(names: Names, pyproject: Path) -> list[str]:
    """Add the family to a uv workspace root's pyproject; returns what was added."""
    text = pyproject.read_text()
    config = tomllib.loads(text)
    added = []
    deps = config.get("project", {}).get("dependencies", [])
    if not any(re.match(rf"{re.escape(names.dist)}\b(?!-)", d) for d in deps):
        text = _add_to_array(text, "project", "dependencies", names.dist)
        added.append(f"[project] dependencies: {names.dist}")
    members = config.get("tool", {}).get("uv", {}).get("workspace", {}).get("members")
    if members is None:
        raise ValueError(f"{pyproject} is not a uv workspace root (no members)")
    if names.dist not in members:
        text = _add_to_array(text, "tool.uv.workspace", "members", names.dist)
        added.append(f"[tool.uv.workspace] members: {names.dist}")
    sources = config.get("tool", {}).get("uv", {}).get("sources", {})
    if names.dist not in sources:
        text = _add_line(
            text, "tool.uv.sources", f"{names.dist} = {{ workspace = true }}"
        )
        added.append(f"[tool.uv.sources] {names.dist}")
    include = config.get("tool", {}).get("pyright", {}).get("include")
    # Its sources and its tests: both are type-checked, as every family's are.
    for folder in (f"{names.dist}/src", f"{names.dist}/tests"):
        if include is not None and folder not in include:
            text = _add_to_array(text, "tool.pyright", "include", folder)
            added.append(f"[tool.pyright] include: {folder}")
    tomllib.loads(text)  # still valid TOML
    pyproject.write_text(text)
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("name", help="the family's name, e.g. banded")
    parser.add_argument(
        "--dest",
        type=Path,
        default=TEMPLATE.parent.parent,
        help="the workspace root to generate into (default: this repository)",
    )
    args = parser.parse_args(argv)
    try:
        names = Names.of(args.name)
    except ValueError as e:
        parser.error(str(e))
    written = generate(names, args.dest)
    root = args.dest / names.dist
    print(
        f"{root}: {len(written)} file(s) written" + ("" if written else " (all kept)")
    )
    pyproject = args.dest / "pyproject.toml"
    if pyproject.exists():
        added = add_to_workspace(names, pyproject)
        for line in added or ["nothing to add: the family is already listed"]:
            print(f"{pyproject}: {line}")
        print("next: uv lock && uv sync, then pytest " + f"{names.dist}/tests")
    else:
        print(f"no {pyproject}: add {names.dist} to your workspace by hand")
    return 0


if __name__ == "__main__":
    sys.exit(main())
