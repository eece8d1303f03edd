"""One naming rule for the families' refusals: the family named `name` (its entry point
in `quax.rules`) exports its refusal as `<Name>MaterialisationError` (`name` in
CamelCase: `LoraMaterialisationError`, `BandedMatrixMaterialisationError`), a subclass
of `quax.MaterialisationError`, and its value types raise it. The template's scaffold
(`templates/new_family.py`) derives the same name, so a generated family follows it.
"""

import importlib
import importlib.util
import pathlib
import sys

import pytest
import quax


ROOT = pathlib.Path(__file__).resolve().parent.parent
FIRST_PARTY = {"lora", "sparse", "units", "quant", "structured", "named"}
# The names 0.5.0 documented (`quax_lora.MaterialisationError`, ...): aliases of the
# family's error, the same class. `quax_named` never had one.
ALIASED = FIRST_PARTY - {"named"}


def _scaffold_names():
    path = ROOT / "templates" / "new_family.py"
    spec = importlib.util.spec_from_file_location("quax_template_scaffold", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up in `sys.modules` while the class is built.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module.Names


def _families():
    return [f for f in quax.plugins.load() if not f.builtin]


def test_first_party_families_are_installed():
    # The rule below is checked on the installed families: all six must be there.
    assert {f.name for f in _families()} >= FIRST_PARTY


@pytest.mark.parametrize("family", _families(), ids=lambda f: f.name)
def test_family_error_follows_the_rule(family):
    assert family.state == "loaded", family.error
    expected = _scaffold_names().of(family.name).error
    assert expected == (
        "".join(part.capitalize() for part in family.name.split("_"))
        + "MaterialisationError"
    )
    package = importlib.import_module(family.package)
    error = getattr(package, expected, None)
    assert isinstance(error, type), f"{family.package} does not export {expected}"
    assert issubclass(error, quax.MaterialisationError)
    assert error.__name__ == expected
    assert error.__module__.split(".")[0] == family.package

    # No other refusal under another name; the 0.5.0 name is the same class.
    others = {
        name: getattr(package, name)
        for name in dir(package)
        if name.endswith("MaterialisationError") and name != expected
    }
    if family.name in ALIASED:
        assert others == {"MaterialisationError": error}
    elif family.name in FIRST_PARTY:
        assert others == {}
    else:  # a third-party family: at most the alias
        assert all(v is error for v in others.values()), others

    # Every value type of the family that follows the core's policy raises it.
    types = [t for result in [family.plugin.quax_value_types()] for t in result]
    guarded = [t for t in types if issubclass(t, quax.GuardedValue)]
    assert guarded, f"{family.name} declares no quax.GuardedValue"
    for value_type in guarded:
        assert issubclass(value_type.materialisation_error, error), value_type
