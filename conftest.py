"""Strict settings for every test suite in the repository: tracer-leak checks and
quax's rule-output checks are on, and warnings are errors (see pyproject.toml).

JAX's leak check runs a full garbage collection each time a finished trace is still
alive (quax's traces often are, held in reference cycles until a collection). With
JAX, the families and the test modules imported, a full collection scans about
160,000 objects. So the objects alive after collection, and after each test, are moved
to the collector's permanent generation (`gc.freeze`): later collections scan only
what the running test made. The tracers a leak check looks for are always the running
test's, so it finds the same ones. Every 100 tests the permanent generation is collected
once, so that cycles which died later are still freed.

Under the leak check JAX also stops caching the compiled program of each primitive
applied outside a trace (one per primitive and parameters), so every `jnp` call in a
test's references was compiled anew. `quax.testing.cache_eager_primitive_programs` puts
that cache back as JAX keeps it without the check (keyed by the trace context too): its
programs hold concrete parameters, no tracers, so the leak check reports the same
tracers.

Tests marked `long_running` are collected first, to balance the two workers' ends
(`pytest_collection_modifyitems` below).

`scripts/test.sh` turns XLA's MLIR fusion emitters off (`XLA_FLAGS` holds
`--xla_cpu_use_fusion_emitters=false`: the programs compile in about half the time).
XLA's HLO pipeline then differs too (other fusions, other gather shapes), so where the
flag is set, a program compiled ahead of time (`jax.jit(f).lower(...).compile()`, as
`quax.testing.compiled_hlo` and the tests that read optimised HLO compile) is compiled
with the emitters on (`_compile_ahead_as_users_do` below): the HLO a test reads is the
HLO users' programs compile to; the programs the tests run are compiled with the
flag.

JAX lowers every program into a new MLIR context (`mlir.make_ir_context`), which
loads each dialect JAX uses into it: about 6 ms of CPU a program, paid by each of the
thousands of small programs the suites compile. Here the outermost lowerings of each
thread share one context, a new one every 100 (`_share_mlir_contexts` below), so that
what the shared context keeps (the types and attributes of every program lowered in
it) stays small. A context holds no state of its own that the lowering reads: the
modules, and so the programs compiled and the keys of the persistent compilation
cache, are the same (checked on three of quax-quant's conformance tests: the same
cache entries). Measured, one process, CPU time (user + sys): quax-quant's
test_conformance.py 85.1 s -> 66.2 s; three of quax-structured's files (pinv,
composite, linalg decompositions) 76.9 s -> 60.9 s."""

import functools
import gc
import os
import threading
from typing import Any

import jax
import pytest
import quax
import quax._compat
import quax.testing


jax.config.update("jax_check_tracer_leaks", True)
quax.set_debug_checks(True)

# On an accelerator, float32 matrix products are float32-accurate: a TPU multiplies
# float32 in bfloat16 passes by default (GPUs in TensorFloat-32), which no float32
# tolerance of a comparison with the dense computation covers
# (`quax.testing.tolerance`). The suites check that quax computes what the dense
# program computes, at the dtype's accuracy; the benchmarks run at JAX's defaults.
if jax.default_backend() != "cpu":
    jax.config.update("jax_default_matmul_precision", "highest")


quax.testing.cache_eager_primitive_programs()


_FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"


def _compile_ahead_as_users_do() -> None:
    """Where `XLA_FLAGS` turns XLA's fusion emitters off, `Lowered.compile` (the
    ahead-of-time compile the HLO checks read) turns them back on, unless its caller
    sets `xla_cpu_use_fusion_emitters` itself."""
    if _FUSION_EMITTERS_OFF not in os.environ.get("XLA_FLAGS", "").split():
        return
    compile_ = jax.stages.Lowered.compile

    @functools.wraps(compile_)
    def compile_with_fusion_emitters(
        self: jax.stages.Lowered,
        compiler_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> jax.stages.Compiled:
        options = {"xla_cpu_use_fusion_emitters": True, **(compiler_options or {})}
        return compile_(self, options, **kwargs)

    jax.stages.Lowered.compile = compile_with_fusion_emitters


_compile_ahead_as_users_do()


# Outermost lowerings that share one MLIR context (in each thread), before a new one.
_LOWERINGS_PER_CONTEXT = 100


def _share_mlir_contexts() -> None:
    """JAX's `mlir.make_ir_context` returns, for the module of an outermost lowering
    (`mlir.lower_jaxpr_to_module`), one context of this thread for
    `_LOWERINGS_PER_CONTEXT` of them in turn, then a new one. A lowering inside
    another (a lowering rule that runs a program, as lineax's does, compiling it
    while the outer module is being built) gets a new context, as every other
    caller does: the outer lowering's insertion point is active in the shared one."""
    local = threading.local()  # context, uses, busy, wanted: this thread's

    def wrap_context(make: Any) -> Any:
        return functools.wraps(make)(lambda: shared_for_the_outermost_lowering(make))

    def wrap_lowering(lower: Any) -> Any:
        return functools.wraps(lower)(
            lambda *args, **kwargs: lower_jaxpr_to_module(lower, *args, **kwargs)
        )

    def shared_for_the_outermost_lowering(make: Any) -> Any:
        if not getattr(local, "wanted", False):
            return make()
        local.wanted = False
        if local.context is None or local.uses >= _LOWERINGS_PER_CONTEXT:
            local.context, local.uses = make(), 0
        local.uses += 1
        return local.context

    def lower_jaxpr_to_module(lower: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(local, "busy", False):
            return lower(*args, **kwargs)
        if not hasattr(local, "context"):
            local.context, local.uses = None, 0
        local.busy, local.wanted = True, True
        try:
            return lower(*args, **kwargs)
        finally:
            local.busy, local.wanted = False, False

    quax._compat.wrap_module_lowering(wrap_context, wrap_lowering)


_share_mlir_contexts()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long_running: the test takes ten seconds or more in CI, so it runs before "
        "the others (conftest.py)",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `long_running` run first (each group keeps its order).

    With two xdist workers (`--dist worksteal`), a long test that starts last keeps
    one core busy while the other has nothing left to take: the run lasts as long
    as that test's end. Started first, the long tests are done while the short ones
    still fill both cores, and the run ends with short tests on both."""
    items.sort(key=lambda item: item.get_closest_marker("long_running") is None)


_FULL_COLLECTION_EVERY = 100
_tests_run = 0


def _collect_and_freeze(full: bool) -> None:
    if full:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _collect_and_freeze(full=False)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    global _tests_run
    _tests_run += 1
    _collect_and_freeze(full=_tests_run % _FULL_COLLECTION_EVERY == 0)
