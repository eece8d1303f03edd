"""`quax.examples.<name>`: the installed families, by name or alias.

`import quax.examples.lora as lora` imports the installed `lora` family (the
distribution `quax-lora`); a family that is not installed gives an `ImportError`
naming the distribution to install. Nothing is imported until a name is asked for.
"""

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

from .._dispatch import _plugins


class _FamilyLoader(importlib.abc.Loader):
    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped its alias spec on the family's module: give the
        # module back its own, so that reloading and pickling see the real name.
        module.__spec__ = self.spec


class _FamilyFinder(importlib.abc.MetaPathFinder):
    """Resolves `import quax.examples.<name>` to the family's own module."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix = __name__ + "."
        if not fullname.startswith(prefix) or "." in fullname[len(prefix) :]:
            return None
        module = _plugins.example_module(fullname[len(prefix) :])
        return importlib.machinery.ModuleSpec(fullname, _FamilyLoader(module))


if not any(isinstance(f, _FamilyFinder) for f in sys.meta_path):
    sys.meta_path.append(_FamilyFinder())


def __getattr__(name: str) -> ModuleType:
    if name.startswith("__"):
        raise AttributeError(name)
    module = _plugins.example_module(name)
    globals()[name] = module
    return module
