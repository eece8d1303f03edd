#!/usr/bin/env bash
# The property tests (every test module with a hypothesis `@given`) under many random
# seeds: the exploration that CI's fixed seed leaves out. On demand, not in CI.
#
#   bash scripts/hypothesis_sweep.sh [SEEDS] [PATHS...]
#
# SEEDS (default 20) runs seeds 1..SEEDS; PATHS defaults to every such module.
# QUAX_HYPOTHESIS_SCALE=N (default 1, as in CI) multiplies the examples of the property
# tests whose count CI keeps small (each example compiles a new program; see
# scripts/test.sh): `QUAX_HYPOTHESIS_SCALE=3 bash scripts/hypothesis_sweep.sh 5`. A failure
# prints hypothesis's reproduction (the seed and `@reproduce_failure`); fix it with a
# regression test, then rerun.
source "$(dirname "$0")/_env.sh"
export JAX_PLATFORMS=cpu JAX_CHECK_TRACER_LEAKS=1 QUAX_DEBUG_CHECKS=1
export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0"
seeds=${1:-20}
shift || true
if [ $# -gt 0 ]; then
    paths=("$@")
else
    mapfile -t paths < <(grep -rl --include='test_*.py' '@given' quax-*/tests tests | sort)
fi
failed=0
for seed in $(seq 1 "$seeds"); do
    echo "== seed $seed"
    uv run --locked --no-sync pytest -n 2 -q -p no:cacheprovider \
        --hypothesis-seed="$seed" "${paths[@]}" || failed=1
done
exit $failed
