#!/usr/bin/env bash
# Every test suite: quax-core's and the root tests with every distribution installed,
# then each family's suite with that family installed alone beside quax-core (the
# "pip install quax-core quax-<family>" promise).
source "$(dirname "$0")/_env.sh"
export JAX_PLATFORMS=cpu JAX_CHECK_TRACER_LEAKS=1 QUAX_DEBUG_CHECKS=1
# XLA compiles the CPU programs without LLVM's optimisation passes: compiling dominates
# the suites (thousands of small programs), and the optimised HLO the tests read
# (`quax.testing.assert_hlo_lacks`) is the same, only the machine code is not optimised.
# The flag also stops LLVM contracting a multiply and an add into one fused
# multiply-add, which changes results' last bits: so that it hides nothing, quax-lora's
# suite (run alone below) and the clients' suites (scripts/clients.sh) compile as users
# compile, without it.
# `--xla_cpu_use_fusion_emitters=false`: XLA emits each fusion's loops with its
# elemental LLVM emitter, not through the newer MLIR fusion emitters (XLA's default),
# whose lowering pipeline, run for every fusion of every program, cost about half the
# compile time left at optimisation level 0. XLA's HLO passes then differ too (other
# fusions, other gather shapes): so that the tests that read optimised HLO read the
# HLO users' programs compile to, the root conftest.py compiles the programs compiled
# ahead of time (`jax.jit(f).lower(...).compile()`) with the emitters on. quax-lora's
# suite and the clients' suites run without this flag too, as without the other one.
# Measured (2 workers, the same compilations either way, XLA's compile time summed
# over them, then the run's CPU time, user + sys): quax-core and the root tests 194 s
# -> 81 s, 410 s -> 244 s; quax-sparse alone 134 s -> 75 s, 221 s -> 162 s;
# quax-quant alone 77 s -> 40 s, 115 s -> 81 s; quax-named alone 30 s -> 16 s,
# 51 s -> 39 s; two of quax-structured's files, one worker, 28 s -> 15 s, 51 s -> 33 s.
# `--xla_cpu_parallel_codegen_split_count=1`: XLA compiles each program's LLVM module
# as one part, not split into parts for threads to compile at once: with two pytest
# workers on two cores no thread is idle to take a part, and splitting (each part
# its own module to set up and compile) cost CPU. Only how the machine code is
# compiled changes, not the code. Measured, one process, XLA's compile time summed
# (then the process's CPU time): quax-structured's `test_transposed_solves.py` (533
# programs, two runs each way) 35.4 / 35.8 s -> 26.2 / 24.5 s (62.7 / 66.8 s -> 53.3
# / 50.7 s), its `test_linalg_derivatives.py` (one run each) 24.3 s -> 20.8 s (65.2 s
# -> 57.6 s); quax-sparse's `test_conformance.py` (1,231 small programs, one run
# each) unchanged (26.0 s either way).
plain_xla_flags=${XLA_FLAGS:-}
export XLA_FLAGS="$plain_xla_flags --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
# XLA's compiled programs are kept on disk (JAX's persistent compilation cache, keyed by
# the program, the compile options and the jax/jaxlib versions): a family's suite alone
# reads back what the root tests compiled for the same programs, and a rerun of the
# script reads back everything.
export JAX_COMPILATION_CACHE_DIR="$PWD/build/jax-cache"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
# Python's compiled modules (`.pyc`) are kept too, under build/ (not beside the
# sources, nor in the venvs): where PYTHONDONTWRITEBYTECODE is set, every process
# (each pytest run's controller and two workers, in every venv) compiled JAX, NumPy,
# SciPy, hypothesis and the test modules again from source (seconds of CPU each).
# Only the run's speed changes: Python checks each `.pyc` against its source.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/build/pycache"

# Property tests (hypothesis) draw from one fixed seed, so that a run's result is the
# code's and not the draw's: CI on a clean clone passes or fails reproducibly. Set
# QUAX_HYPOTHESIS_SEED to draw from another seed; scripts/hypothesis_sweep.sh runs the
# property tests under many seeds, the exploration this leaves out. Where each example
# compiles a new program (quax-structured's and quax-quant's conformance property
# tests), CI's example counts are a module constant times QUAX_HYPOTHESIS_SCALE
# (default 1), chosen so that the examples at seed 0 still reach every structure,
# format or program of the strategy that they reached before the count was cut (the
# count's comment says what they reach); QUAX_HYPOTHESIS_SCALE=N draws N times as many.
seed=(--hypothesis-seed="${QUAX_HYPOTHESIS_SEED:-0}")
# Each run prints its 15 slowest tests: where CI's time goes, read off its log.
slowest=(--durations=15)
# Sweeps: the tests marked `sweep` repeat a check that an unmarked test already makes,
# over more parametrisations (more solvers, step-size controllers, shapes, dtypes) at
# the cost of more compiles; CI's time limit has no room for them. This script leaves
# them out; `bash scripts/test.sh sweeps` runs them alone, in the same sections and
# environments (on demand, before a release or after a change to what they sweep).
if [ "${1:-}" = sweeps ]; then
    marks="sweep"
else
    marks="not sweep"
fi
# Runs a pytest command; where only the sweeps run, a section that has none (pytest's
# exit status 5, no test collected) is not a failure.
run_pytest() {
    local status=0
    "$@" || status=$?
    if [ "$status" -eq 5 ] && [ "$marks" = sweep ]; then
        echo "(no sweep in this section)"
        return 0
    fi
    return "$status"
}

families=()
for d in quax-*/; do
    d=${d%/}
    [ "$d" = quax-core ] || families+=("$d")
done

echo "== lint (ruff)"
uv run --locked --no-sync ruff check --quiet .
uv run --locked --no-sync ruff format --check --quiet .

# Two workers; `--dist worksteal`: a worker that runs out of tests takes some of the
# other's, so that a few slow tests at the end of one worker's share keep no core idle.
# quax-core's suite and the root tests (families together, real programs) with every
# distribution installed, in the caches' verify mode; each family's own suite runs
# once, alone beside quax-core, below (running it here too doubled CI's time).
#
# Cache verify mode: every cache hit (dispatch, compiled eager programs, replays,
# nested jits, the per-jaxpr tables) is also recomputed and compared, and a mismatch
# raises naming the cache and the key component. It runs what the normal mode runs
# (the cached results go on), with those checks besides, so these tests run in it
# only, as quax-units' suite (its rules read static fields, settings and constants,
# what cache keys most often got wrong) does in its own run below, alone beside
# quax-core. Users' eager calls compile their program only once a key's later calls
# have taken as long as a compile (quax-core/src/quax/_caching/_eager.py), which few
# tests reach; here `QUAX_EAGER_COMPILE_AFTER=0` compiles on a key's second call (as
# quax-core's conftest.py does for its suite), so that every test calling twice runs
# a compiled program and verify mode checks it, and a test's first call runs
# equation by equation, the path users' calls made a few times take (and the one
# the other families' suites below take, in the normal mode). Two kinds of test run
# in the normal mode instead, first: those marked `caching_behaviour` observe the
# caches themselves (quax-core/tests/conftest.py turns verify mode off for them), and
# those marked `normal_mode_only` have another subject than the caches (the
# documentation's code blocks, plain JAX programs in fresh interpreters, the family
# template in a subprocess, the core's layout and structure).
echo "== quax-core's and the root tests of the caches themselves and of other subjects"
run_pytest uv run --locked --no-sync pytest -n 2 --dist worksteal -q "${seed[@]}" "${slowest[@]}" \
    -m "($marks) and (caching_behaviour or normal_mode_only)" quax-core/tests tests

echo "== quax-core's suite and the root tests, every distribution installed, in cache verify mode (QUAX_VERIFY_CACHES=1)"
QUAX_VERIFY_CACHES=1 QUAX_EAGER_COMPILE_AFTER=0 run_pytest uv run --locked --no-sync pytest -n 2 --dist worksteal -q \
    -p no:cacheprovider "${seed[@]}" "${slowest[@]}" quax-core/tests tests \
    -m "($marks) and not caching_behaviour and not normal_mode_only"

for fam in "${families[@]}"; do
    echo "== $fam alone with quax-core"
    venv=$(mktemp -d)/venv
    uv venv --quiet --python 3.11 "$venv"
    reqs=$(mktemp)
    uv export --frozen --quiet --no-hashes --no-emit-workspace --package "$fam" >"$reqs"
    uv export --frozen --quiet --no-hashes --no-emit-workspace --only-group dev >>"$reqs"
    uv pip install --quiet --python "$venv/bin/python" -r "$reqs" -e ./quax-core -e "./$fam"
    flags=$XLA_FLAGS
    [ "$fam" = quax-lora ] && flags=$plain_xla_flags
    verify=(QUAX_VERIFY_CACHES=0)
    [ "$fam" = quax-units ] && verify=(QUAX_VERIFY_CACHES=1 QUAX_EAGER_COMPILE_AFTER=0)
    run_pytest env "${verify[@]}" XLA_FLAGS=$flags "$venv/bin/python" -m pytest -n 2 --dist worksteal -q \
        -p no:cacheprovider "${seed[@]}" "${slowest[@]}" -m "$marks" "$fam/tests"
done
