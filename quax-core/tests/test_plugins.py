"""The plugin contract, tested with real third-party distributions (in
`fixtures/`) installed with pip into a temporary directory."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fixture families, installed as distributions."""
    target = tmp_path_factory.mktemp("site")
    uv = Path(sys.executable).parent / "uv"
    # uv where the environment has it (the workspace's); else pip, as on the
    # accelerator machine (scripts/accel.sh), which has no registry: the fixtures'
    # build backend (hatchling) is installed beside the wheels under test there.
    if uv.exists():
        installer = [str(uv), "pip", "install", "--offline", "--python", sys.executable]
    else:
        installer = [sys.executable, "-m", "pip", "install", "--no-index"]
    subprocess.run(
        [
            *installer,
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            *(str(FIXTURES / name) for name in ("family", "rival", "broken")),
        ],
        check=True,
    )
    return target


def run(site: Path, code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter that sees the fixture distributions; it
    prints one JSON object, returned here."""
    environment = {
        **{k: v for k, v in os.environ.items() if k != "QUAX_DISABLE_PLUGIN_AUTOLOAD"},
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "JAX_PLATFORMS": "cpu",
        **env,
    }
    prelude = "import json, sys, warnings\nwarnings.simplefilter('always')\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def first_import(site: Path) -> dict:
    """A fresh interpreter: the modules `import quax` loads, then the
    `quax.examples` namespace."""
    return run(
        site,
        """
        import quax
        modules = [m for m in sys.modules if m.startswith("quax_")]
        import quax.examples.fixture_family as fam
        from quax._dispatch import _plugins
        # A first-party family that is not installed (every real one is, here).
        _plugins.KNOWN_DISTRIBUTIONS["nonesuch"] = "quax-nonesuch"
        try:
            import quax.examples.nonesuch
            missing = None
        except ImportError as e:
            missing = str(e)
        print(json.dumps({
            "modules": modules,
            "module": fam.__name__,
            "has_tagged": hasattr(fam, "Tagged"),
            "missing": missing,
            "zero": quax.examples.zero.__name__,
        }))
    """,
    )


def test_import_quax_loads_no_family(first_import: dict) -> None:
    assert first_import["modules"] == []


@pytest.fixture(scope="module")
def first_calls(site: Path) -> dict:
    """A fresh interpreter: the first quaxified calls on a family's type (the user
    never imports the family's rules), then an explicit `quax.plugins.load()`."""
    return run(
        site,
        """
        import jax.numpy as jnp, quax
        from quax.plugins import PluginWarning
        from quax import RuleConflictWarning
        with warnings.catch_warnings(record=True) as caught:
            # The user never imports a family: the first quaxified call loads them.
            from quax_fixture_family import Tagged
            loaded_before = "quax_fixture_family._rules" in sys.modules
            out = quax.quaxify(jnp.negative)(Tagged(jnp.arange(3.0)))
            first = [(w.category.__name__, str(w.message)) for w in caught]
            for _ in range(2):
                quax.quaxify(jnp.negative)(Tagged(jnp.arange(3.0)))
            quax.plugins.load()
        print(json.dumps({
            "loaded_before": loaded_before,
            "tag": out.tag,
            "values": out.array.tolist(),
            "warnings": first,
            "n": sum(w.category.__name__ == "PluginWarning" for w in caught),
            "states": {f.name: f.state for f in quax.plugins.families()},
        }))
    """,
    )


def test_rules_fire_without_import_and_precedence_decides(first_calls: dict) -> None:
    out = first_calls
    assert not out["loaded_before"]
    # quax-fixture-rival registered the same signature with a higher precedence.
    assert out["tag"] == "negated by quax-fixture-rival"
    assert out["values"] == [0.0, -1.0, -2.0]
    kinds = {k for k, _ in out["warnings"]}
    assert kinds == {"PluginWarning", "RuleConflictWarning"}
    messages = dict((k, m) for k, m in out["warnings"])
    broken = messages["PluginWarning"]
    assert "quax-fixture-broken" in broken and "fixture_broken" in broken
    assert "quax_fixture_broken_missing_dependency" in broken
    conflict = messages["RuleConflictWarning"]
    assert "quax-fixture-family" in conflict and "quax-fixture-rival" in conflict
    assert "quax-fixture-rival (quax_fixture_rival" in conflict.split("; ")[-1]
    assert "wins by its higher precedence" in conflict


def test_broken_family_is_reported_once(first_calls: dict) -> None:
    # Three calls and an explicit load: one warning.
    assert first_calls["n"] == 1
    assert first_calls["states"]["fixture_broken"] == "failed"
    assert first_calls["states"]["fixture_family"] == "loaded"


def test_disable_autoload(site: Path) -> None:
    out = run(
        site,
        """
        import jax.numpy as jnp, quax
        from quax_fixture_family import Tagged
        x = Tagged(jnp.arange(3.0))
        plain = quax.quaxify(jnp.negative)(x)
        rules_imported = "quax_fixture_family._rules" in sys.modules
        quax.plugins.load("fixture_family")
        tagged = quax.quaxify(jnp.negative)(x)
        print(json.dumps({
            "plain": type(plain).__name__,
            "rules_imported": rules_imported,
            "tag": tagged.tag,
            "states": {f.name: f.state for f in quax.plugins.families()},
        }))
    """,
        QUAX_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    # No rule: the value was materialised and negated as a plain array.
    assert out["plain"] == "ArrayImpl"
    assert not out["rules_imported"]
    assert out["tag"] == "negated by quax-fixture-family"
    assert out["states"] == {
        "fixture_family": "loaded",
        "fixture_rival": "available",
        "fixture_broken": "available",
    } | {k: v for k, v in out["states"].items() if not k.startswith("fixture")}


def test_block_a_family(site: Path) -> None:
    out = run(
        site,
        """
        import jax.numpy as jnp, quax
        quax.plugins.block("fixture_rival")
        quax.plugins.block("fixture_broken")
        from quax_fixture_family import Tagged
        with warnings.catch_warnings(record=True) as caught:
            out = quax.quaxify(jnp.negative)(Tagged(jnp.arange(3.0)))
        print(json.dumps({"tag": out.tag, "n_warnings": len(caught)}))
    """,
    )
    assert out == {"tag": "negated by quax-fixture-family", "n_warnings": 0}


def test_families_loading_inside_a_jit_change_no_key(site: Path) -> None:
    """The first quaxified call is inside a `jax.jit`, so every installed family
    (those of this environment, and the fixture family, which makes a
    `quax.plugins.jit_context` as it loads) loads while that `jit` traces: its next
    calls hit the entry its first call made, and are not traced again. Its
    setting still keys the `jit`: set, it is traced again, and its rule reads it."""
    out = run(
        site,
        """
        import jax, jax.numpy as jnp, quax
        quax.plugins.block("fixture_rival")  # its rule would win over the family's
        from quax_fixture_family import Tagged
        traces = []

        @jax.jit
        def f(a):
            traces.append(None)
            return quax.quaxify(jnp.negative)(Tagged(a))

        loaded = [f.name for f in quax.plugins.families() if f.state == "loaded"]
        with warnings.catch_warnings(record=True):  # the broken fixture family
            tags = [f(jnp.arange(3.0)).tag for _ in range(3)]
        counts = [len(traces)]
        from quax_fixture_family._rules import mark
        with mark("marked"):
            tags += [f(jnp.arange(3.0)).tag for _ in range(2)]
        counts.append(len(traces))
        tags.append(f(jnp.arange(3.0)).tag)
        counts.append(len(traces))
        print(json.dumps({"loaded": loaded, "tags": tags, "counts": counts}))
    """,
    )
    assert out["loaded"] == ["zero"]  # nothing but the built-in family, before
    default = "negated by quax-fixture-family"
    assert out["tags"] == [default] * 3 + ["marked"] * 2 + [default]
    # Traced once; once more under the new value; not again back at the default.
    assert out["counts"] == [1, 2, 2]


def test_examples_namespace(first_import: dict) -> None:
    assert first_import["module"] == "quax_fixture_family"
    assert first_import["has_tagged"]
    missing = first_import["missing"]
    assert "quax-nonesuch" in missing and "pip install" in missing
    assert first_import["zero"] == "quax.zero"


AMBIGUOUS_RULES = """
import jax, quax
from jax.extend.core import Primitive

class A(quax.ArrayValue):
    array: jax.Array

    def aval(self):
        return jax.typeof(self.array)

    def materialise(self):
        return self.array

ambiguous_p = Primitive("quax_test_ambiguous")

@quax.register(ambiguous_p)
def _(x: A, y: quax.Value, **params):
    return x

@quax.register(ambiguous_p)
def _(x: quax.Value, y: A, **params):
    return y
"""

STRICT_VALUE = """
import jax, quax

class Strict(quax.GuardedValue):
    array: jax.Array

    def aval(self):
        return jax.typeof(self.array)

    def dense(self):
        return self.array
"""

# Command lines run by `python -m quax`'s `main` in one interpreter (starting one
# per command line would import JAX each time); the conflict under warnings as
# errors, which needs a fresh interpreter, is run on its own below.
COMMAND_LINES = {
    "families": ["families"],
    "explain": ["explain", "neg", "Tagged"],
    "fallback": ["explain", "sin", "Tagged"],
    "no_primitive": ["explain", "no_such_primitive", "array"],
    "no_type": ["explain", "neg", "NoSuchType"],
    "no_module": ["explain", "neg", "no_such_module:T"],
    "no_colon": ["materialised", "nocolon"],
    "no_target_module": ["materialised", "no_such_module:main"],
    "no_function": ["materialised", "os:no_such_function"],
    "zero_rule": ["explain", "mul", "Zero", "array"],
    "strict": ["explain", "exp", "strict_value:Strict"],
    # Last: it registers rules in the interpreter.
    "ambiguous": [
        "explain",
        "quax_test_ambiguous",
        "ambiguous_rules:A",
        "ambiguous_rules:A",
    ],
}

_DRIVER = """
import contextlib, io, json, sys, traceback
from quax.__main__ import main

results = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = 1
    results[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def cli(site: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`COMMAND_LINES` run by `python -m quax`'s `main`: for each, the exit status,
    stdout and stderr (a `CompletedProcess`)."""
    modules = tmp_path_factory.mktemp("modules")
    (modules / "ambiguous_rules.py").write_text(AMBIGUOUS_RULES)
    (modules / "strict_value.py").write_text(STRICT_VALUE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(modules), str(site), os.environ.get("PYTHONPATH", "")]
        ),
        "PYTHONWARNINGS": "ignore",
    }
    result = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(COMMAND_LINES)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        name: subprocess.CompletedProcess(COMMAND_LINES[name], code, out, err)
        for name, (code, out, err) in runs.items()
    }


def test_command_line(cli: dict) -> None:
    families = cli["families"]
    assert families.returncode == 0, families.stderr
    assert "fixture_family: quax-fixture-family 1.2.3 [loaded]" in families.stdout
    assert "value types: Tagged" in families.stdout
    assert "fixture_broken: quax-fixture-broken 1.2.3 [failed]" in families.stdout
    explain = cli["explain"]
    assert explain.returncode == 0, explain.stderr
    assert (
        "neg(Tagged) -> rule: registered rule quax_fixture_rival._plugin"
        in explain.stdout
    )
    assert cli["fallback"].returncode == 0, cli["fallback"].stderr
    assert "sin(Tagged) -> materialise" in cli["fallback"].stdout


def _cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        # Warnings are errors, but the one a Cloud TPU machine's JAX gives at import
        # (transparent hugepages are off: that machine's setting, not quax's). The
        # command runs on the CPU: only one process can hold a TPU.
        "PYTHONWARNINGS": "error,ignore:Transparent hugepages are not enabled",
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(
        [sys.executable, "-m", "quax", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _one_line_error(result: subprocess.CompletedProcess, match: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("python -m quax ")
    assert match in lines[0], lines[0]


def test_command_line_errors_are_one_line(site: Path, cli: dict) -> None:
    _one_line_error(cli["no_primitive"], "No JAX primitive named 'no_such_primitive'")
    _one_line_error(cli["no_type"], "unknown type")
    _one_line_error(cli["no_module"], "cannot find the type")
    _one_line_error(cli["no_colon"], "expected MODULE:FUNCTION")
    _one_line_error(cli["no_target_module"], "cannot load")
    _one_line_error(cli["no_function"], "cannot load")
    # Two installed families register the same signature: under warnings as
    # errors, the conflict is the error (in a fresh interpreter: the families load
    # under that setting).
    _one_line_error(_cli(site, "explain", "neg", "Tagged"), "quax-fixture-rival")


def test_command_line_ambiguity_is_one_line(cli: dict) -> None:
    _one_line_error(cli["ambiguous"], "Ambiguous quax rules")


def test_explain_names_file_and_line_and_refusing_defaults(cli: dict) -> None:
    rule = cli["zero_rule"]
    assert rule.returncode == 0, rule.stderr
    assert re.search(r"-> rule: .*_rules\.py:\d+", rule.stdout), rule.stdout
    strict = cli["strict"]
    assert strict.returncode == 0, strict.stderr
    assert "exp(Strict) -> default: `Strict.default`" in strict.stdout
    assert "Strict refuses to materialise unless allow_materialise=True" in (
        strict.stdout
    )


def test_published_quax_beside_quax_core_is_reported(tmp_path: Path) -> None:
    # The published `quax` distribution's metadata, as `pip install unxt` leaves it.
    info = tmp_path / "quax-0.4.6.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: quax\nVersion: 0.4.6\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), os.environ.get("PYTHONPATH", "")]
        ),
        "JAX_PLATFORMS": "cpu",
    }
    imported = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import quax"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "QuaxShadowWarning" in imported.stderr
    assert "`quax` 0.4.6 (the published quax) is installed beside" in imported.stderr
    families = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "quax", "families"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert families.startswith("warning: The distribution `quax` 0.4.6")
    assert "override-dependencies" in families


def test_no_shadow_warning_without_the_published_quax() -> None:
    from quax._foundation._shadow import shadowing_message

    assert shadowing_message() is None
