"""The plugin contract, tested with real third-party distributions (in
`fixtures/`) installed with pip into a temporary directory."""

import json
import os
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
    subprocess.run(
        [
            str(uv),
            "pip",
            "install",
            "--quiet",
            "--offline",
            "--no-deps",
            "--no-build-isolation",
            "--python",
            sys.executable,
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


def test_import_quax_loads_no_family(site: Path) -> None:
    out = run(
        site,
        """
        import quax
        print(json.dumps([m for m in sys.modules if m.startswith("quax_")]))
    """,
    )
    assert out == []


def test_rules_fire_without_import_and_precedence_decides(site: Path) -> None:
    out = run(
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
        print(json.dumps({
            "loaded_before": loaded_before,
            "tag": out.tag,
            "values": out.array.tolist(),
            "warnings": [(w.category.__name__, str(w.message)) for w in caught],
        }))
    """,
    )
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


def test_broken_family_is_reported_once(site: Path) -> None:
    out = run(
        site,
        """
        import jax.numpy as jnp, quax
        from quax_fixture_family import Tagged
        with warnings.catch_warnings(record=True) as caught:
            for _ in range(3):
                quax.quaxify(jnp.negative)(Tagged(jnp.arange(3.0)))
            quax.plugins.load()
        states = {f.name: f.state for f in quax.plugins.families()}
        print(json.dumps({
            "n": sum(w.category.__name__ == "PluginWarning" for w in caught),
            "states": states,
        }))
    """,
    )
    assert out["n"] == 1
    assert out["states"]["fixture_broken"] == "failed"
    assert out["states"]["fixture_family"] == "loaded"


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


def test_examples_namespace(site: Path) -> None:
    out = run(
        site,
        """
        import quax
        import quax.examples.fixture_family as fam
        try:
            import quax.examples.sparse
            missing = None
        except ImportError as e:
            missing = str(e)
        print(json.dumps({
            "module": fam.__name__,
            "has_tagged": hasattr(fam, "Tagged"),
            "missing": missing,
            "zero": quax.examples.zero.__name__,
        }))
    """,
    )
    assert out["module"] == "quax_fixture_family"
    assert out["has_tagged"]
    assert "quax-sparse" in out["missing"] and "pip install" in out["missing"]
    assert out["zero"] == "quax.zero"


def test_command_line(site: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "PYTHONWARNINGS": "ignore",
    }
    families = subprocess.run(
        [sys.executable, "-m", "quax", "families"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "fixture_family: quax-fixture-family 1.2.3 [loaded]" in families
    assert "value types: Tagged" in families
    assert "fixture_broken: quax-fixture-broken 1.2.3 [failed]" in families
    explain = subprocess.run(
        [sys.executable, "-m", "quax", "explain", "neg", "Tagged"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "neg(Tagged) -> rule: registered rule quax_fixture_rival._plugin" in explain
    fallback = subprocess.run(
        [sys.executable, "-m", "quax", "explain", "sin", "Tagged"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "sin(Tagged) -> materialise" in fallback
