"""Tests written for mutants of `quax/_caching/_eager.py` that a sampled run of
`scripts/mutation.sh caching-eager` let through (see `docs/mutation.md`), each
failing with its mutant planted."""

import os
import subprocess
import sys


def test_a_cpu_keeps_the_barriers_under_xlas_default_flags() -> None:
    """Under XLA's default flags (the tests' `XLA_FLAGS` turn the CPU backend's
    optimisations off, so that no multiply and add is contracted there whether the
    barriers are kept or not), the check that a CPU keeps the barriers of
    `eval_rounding_each_step` says so: eager calls on a CPU then run as one
    compiled program (mutant `_barriers_kept_on` 40 compiled the check's own
    program without `KEEP_BARRIERS`: XLA removed its barriers and contracted
    `x * 10 - y` into a fused multiply-add, which the check read as "not kept",
    and every eager call on a CPU ran equation by equation). Run in a fresh
    process, which mutmut does not see."""
    code = (
        "import jax, quax._caching._eager as e; "
        "print(e._barriers_kept_on(jax.devices('cpu')[0]), e._barriers_hold('cpu'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["True", "True"], out.stderr
