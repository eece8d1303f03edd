"""`quax.testing.assert_family_layout`: the roles, the one-way imports and the
materialisation policy, checked on small families written to a temporary folder."""

import sys
import textwrap
from pathlib import Path

import pytest
import quax.testing as qt


# The distributions' layout on disk: its subject is the files, not the caches; so they
# run in the normal mode only (scripts/test.sh), not in the cache verify mode run.
pytestmark = pytest.mark.normal_mode_only


GOOD = {
    "__init__.py": "from ._value import Good as Good\nfrom . import _rules\n",
    "_kernels.py": "def twice(x):\n    return 2 * x\n",
    "_value.py": """
        import jax, quax
        from ._kernels import twice

        class GoodError(quax.MaterialisationError):
            pass

        class Good(quax.GuardedValue):
            array: jax.Array

            def aval(self):
                return jax.typeof(self.array)

            def dense(self):
                return twice(self.array) / 2
        """,
    "_rules.py": """
        import quax
        from jax import lax
        from ._value import Good

        @quax.register(lax.neg_p)
        def _(x: Good, **params):
            return Good(-x.array)
        """,
    "_nnx.py": "from ._value import Good\n",
    "_model.py": "from ._nnx import Good\n",
    "_plugin.py": "def quax_register_rules():\n    import {name}\n",
}


def _write(root: Path, name: str, files: dict[str, str]) -> str:
    package = root / name
    for relative, text in files.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).format(name=name))
    return name


@pytest.fixture
def family(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def make(name: str, changes: dict[str, str | None]) -> str:
        files = {**GOOD, **changes}
        written.append(name)
        return _write(tmp_path, name, {k: v for k, v in files.items() if v})

    yield make
    for name in written:
        for module in [m for m in sys.modules if m.split(".")[0] == name]:
            del sys.modules[module]


def test_a_family_in_the_layout_passes(family):
    qt.assert_family_layout(family("layout_good", {}))


def test_a_values_package_counts_as_the_values_role(family):
    name = family(
        "layout_values_package",
        {
            "_value.py": None,
            "_values/__init__.py": "from ._good import Good as Good\n",
            "_values/_good.py": GOOD["_value.py"].replace("._kernels", ".._kernels"),
            "__init__.py": "from ._values import Good as Good\nfrom . import _rules\n",
            "_rules.py": GOOD["_rules.py"].replace("._value", "._values"),
            "_nnx.py": "from ._values import Good\n",
            "_model.py": "from ._nnx import Good\n",
        },
    )
    qt.assert_family_layout(name)


def test_every_departure_is_named(family):
    name = family(
        "layout_bad",
        {
            "_plugin.py": None,
            # A kernel importing the values; a cycle through a deferred import.
            "_kernels.py": """
                def twice(x):
                    from ._value import Good
                    return 2 * x
                """,
            # A rule registered outside the rules; the package imported by a module.
            "_model.py": """
                import quax
                from jax import lax
                import {name}
                from ._value import Good
                @quax.register(lax.exp_p)
                def _(x: Good, **params):
                    return x
                """,
            "_errors.py": """
                class BadMaterialisationError(RuntimeError):
                    pass
                """,
            # The NNX module calling back into the model it serves.
            "_nnx.py": """
                from ._value import Good

                def convert(model):
                    from ._model import Good
                    return model
                """,
        },
    )
    problems = qt.family_layout_problems(name)
    text = "\n".join(problems)
    assert "has no plugin module: add `_plugin.py`" in text
    assert "layout_bad._kernels (line 3) imports layout_bad._value" in text
    assert "the kernels must not import the values" in text
    assert "import cycle between `_kernels`, `_value`" in text
    assert "layout_bad._nnx (line 5) imports layout_bad._model" in text
    assert "the nnx must not import the model" in text
    assert "layout_bad._model (line 6) registers a rule" in text
    assert "layout_bad._model (line 4) imports the package `layout_bad` itself" in text
    assert "BadMaterialisationError does not subclass `quax.MaterialisationError`" in (
        text
    )
    with pytest.raises(AssertionError, match="does not follow quax's family layout"):
        qt.assert_family_layout(name)


def test_a_value_with_its_own_policy_is_named(family):
    name = family(
        "layout_own_policy",
        {
            "_value.py": """
                import jax, quax

                class Good(quax.ArrayValue):
                    array: jax.Array

                    def aval(self):
                        return jax.typeof(self.array)

                    def materialise(self):
                        return self.array

                    def enable_materialise(self, allow=True):
                        return self
                """,
        },
    )
    (problem,) = qt.family_layout_problems(name)
    assert "Good defines its own `enable_materialise`" in problem
    assert "subclass `quax.GuardedValue`" in problem
