"""A plain JAX program (no quax value in it) is the same program with quax imported
and every installed family loaded: the same results, bit for bit, eagerly and
jitted, and the same compiled HLO and jaxpr, but for the differences that
docs/architecture.md ("What quax changes in JAX") lists. Each side runs in a fresh
interpreter, so that neither sees the other's patches."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest


# Plain JAX programs, each in a fresh interpreter: their subject is JAX without quax,
# not the caches; so they run in the normal mode only (scripts/test.sh), not in the
# cache verify mode run.
pytestmark = pytest.mark.normal_mode_only


# Prints, as JSON, what JAX makes of two plain programs: `common`, which uses no
# function a family registered a rule for with `quax.register_function` whose `jit`
# JAX inlines, and `kept`, which does (`jnp.rad2deg`, `jnp.deg2rad`: quax-units).
_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import equinox as eqx
    import jax, jax.numpy as jnp, numpy as np

    if sys.argv[1] != "plain":
        import quax
        if sys.argv[1] == "loaded":
            quax.plugins.load()
            assert {"units", "structured", "lora"} <= {
                f.name for f in quax.plugins.families() if f.state == "loaded"
            }

    def common(x, y):
        a = jnp.hypot(x, y) * jnp.exp(x) + (jnp.sin(x) @ y.T).sum()
        b = jax.lax.fori_loop(0, 3, lambda i, c: c * 1.5 + jnp.cos(c), a)
        c = jnp.linalg.pinv(b[:, :3])
        s = jax.eval_shape(lambda t: t * 2, x)
        t = eqx.filter_eval_shape(lambda t: t + 1, y)
        g = jax.grad(lambda z: jnp.sum(jnp.hypot(z, 2.0)))(x)
        h = jax.vmap(lambda r: jnp.linalg.norm(r))(x)
        return b.sum() + c.sum() + s.shape[0] + t.shape[1], g, h

    def kept(x, y):
        a = jnp.rad2deg(x) * y
        return jax.lax.fori_loop(0, 3, lambda i, c: c * 1.5 + jnp.deg2rad(c), a)

    def equations(jaxpr):
        # The equations, with the body of every inline `jit` in its place (a `jit`
        # JAX inlines, unless a `register_function` rule keeps it as a call).
        out = []
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "jit" and eqn.params["inline"]:
                out += equations(eqn.params["jaxpr"].jaxpr)
            else:
                out.append(eqn.primitive.name)
        return out

    x = jnp.linspace(0.1, 1.0, 12, dtype=jnp.float32).reshape(3, 4)
    y = jnp.linspace(-1.0, 2.0, 12, dtype=jnp.float32).reshape(3, 4)
    out = {}
    for name, f in (("common", common), ("kept", kept)):
        closed = jax.make_jaxpr(f)(x, y)
        out[name] = {
            "jaxpr": str(closed),
            "equations": equations(closed.jaxpr),
            "hlo": jax.jit(f).lower(x, y).compile().as_text(),
            "eager": [np.asarray(o).tobytes().hex() for o in jax.tree.leaves(f(x, y))],
            "jit": [
                np.asarray(o).tobytes().hex() for o in jax.tree.leaves(jax.jit(f)(x, y))
            ],
        }
    json.dump(out, sys.stdout)
    """
)


def _made(mode: str) -> dict:
    # Each side compiles its programs itself: with JAX's persistent compilation cache
    # (scripts/test.sh sets one) a side may read the executable the other compiled,
    # whose text is not what the compiler printed for it (seen on a cold cache).
    dropped = {"QUAX_DISABLE_PLUGIN_AUTOLOAD", "JAX_COMPILATION_CACHE_DIR"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, mode],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _without_metadata(hlo: str) -> list[str]:
    """The compiled HLO's instructions, without what records where Python made them
    (the source locations and stack frames, the `metadata` of each instruction) and
    without the numbers that tell instructions of one name apart."""
    body = hlo.split("\n\n\n", 1)[-1] if "StackFrames" in hlo else hlo
    body = re.sub(r", metadata=\{[^}]*\}", "", body)
    return re.sub(r"\.\d+\b", "", body).splitlines()


@pytest.fixture(scope="module")
def made() -> dict[str, dict]:
    return {mode: _made(mode) for mode in ("plain", "imported", "loaded")}


@pytest.mark.parametrize("program", ["common", "kept"])
def test_import_quax_changes_no_plain_program(made, program):
    # `import quax` alone (the built-in symbolic zeros loaded, no other family).
    assert made["imported"][program] == made["plain"][program]


@pytest.mark.parametrize("program", ["common", "kept"])
def test_loaded_families_change_no_result_nor_compiled_program(made, program):
    plain, loaded = made["plain"][program], made["loaded"][program]
    assert loaded["eager"] == plain["eager"]
    assert loaded["jit"] == plain["jit"]
    # The same instructions: only the source locations differ, where JAX's `jvp`
    # of a `jit` runs through quax's wrapper of its rule (`_foundation/_jit_rules.py`).
    assert _without_metadata(loaded["hlo"]) == _without_metadata(plain["hlo"])
    # The same equations, once every inline `jit` is inlined.
    assert loaded["equations"] == plain["equations"]


def test_loaded_families_change_the_jaxpr_only_by_kept_calls(made):
    # A program with no function that a family keeps as a call: the same jaxpr.
    assert made["loaded"]["common"]["jaxpr"] == made["plain"]["common"]["jaxpr"]
    # `jnp.rad2deg` (quax-units registers a rule for it) stays a `jit` call in the
    # jaxpr JAX traces, where plain JAX inlines its one multiplication.
    plain, loaded = made["plain"]["kept"]["jaxpr"], made["loaded"]["kept"]["jaxpr"]
    assert "name=rad2deg" not in plain
    assert "name=rad2deg" in loaded and "name=deg2rad" in loaded
