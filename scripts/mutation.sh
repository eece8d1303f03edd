#!/usr/bin/env bash
# Mutation testing (mutmut) of one module: every one-line change mutmut can plant in it
# (an operator, a constant, a comparison, a dropped argument...) is run against a fast
# selection of the tests that exercise that module, and each mutant the tests let
# through is a missing test or an equivalent change. On demand, never in CI: one module
# takes minutes to an hour or more. docs/mutation.md has the kill rates measured, each
# surviving mutant's verdict, and which modules have not been run.
#
#   bash scripts/mutation.sh list              # the targets, their modules and tests
#   bash scripts/mutation.sh TARGET [ARGS...]  # mutate TARGET's module, run its tests
#   bash scripts/mutation.sh TARGET names [SEED]   # every mutant of its module, by name
#   bash scripts/mutation.sh TARGET sample N SEED  # run a uniform random sample of them
#   bash scripts/mutation.sh --decorated TARGET ...  # the same, with decorated functions
#   bash scripts/mutation.sh --suite TARGET ...      # against the whole suite, as CI runs it
#
# `sample` is for a module whose whole run does not fit the time at hand. `names` lists
# every mutant mutmut makes of the module, without running anything; given a SEED, in a
# random order (the sorted names shuffled by Python's `random.Random(SEED)`). `sample`
# runs the first N of that order: a uniform random sample, the same for the same SEED,
# whose kill rate estimates the module's (docs/mutation.md says which seed each sample
# used). To extend a sample without rerunning it, run the next names of that order:
#
#   bash scripts/mutation.sh TARGET $(bash scripts/mutation.sh TARGET names SEED | sed -n 11,20p)
#
# ARGS go to `mutmut run` (mutant names, or `--max-children N`; the default is one
# child process, niced, as the machine is shared). The run works in a copy, under
# build/mutation/TARGET/ (the distribution's `src/` and `tests/`, the root conftest.py,
# and a pyproject.toml holding the root's pytest settings and mutmut's), so the
# checkout is never changed; a second run of the same target reuses the results of
# the mutants whose function did not change. Afterwards, in that folder:
#
#   ../../../.venv/bin/mutmut results           # the mutants not killed
#   ../../../.venv/bin/mutmut show NAME         # one mutant's diff
#   ../../../.venv/bin/mutmut export-cicd-stats # the counts, as mutants/mutmut-cicd-stats.json
#
# To try a new test on a surviving mutant: add the test under the distribution's
# tests/, rerun this script with the target and the mutant's name (the copy of the
# tests is refreshed on every run).
#
# mutmut never mutates a function that carries a decorator (other than a lone
# `@staticmethod` or `@classmethod`), so no rule defined under `@quax.register(...)`
# is mutated by default. With `--decorated` first, the copy of the module is
# rewritten before mutmut reads it (scripts/mutation_decorated.py): each decorated
# function outside a class becomes a plain one decorated by an assignment after it,
# and each named `_` is renamed `_line_N` after the line of its `def`, every other
# line keeping its number. Then `names` and `sample` list only the mutants inside
# those functions (mutmut's own mutants of the other functions are unchanged, by
# name too); a run without names runs them all. That mode works in its own folder,
# build/mutation/TARGET-decorated/, so that the default mode's names and results
# stay as they were.
#
# A target's list of test files is a fast selection; CI runs the distribution's whole
# tests/ but the tests marked `sweep` (scripts/test.sh). With `--suite` first (before
# or after `--decorated`), the mutants run against that: the selection is all of the
# copy's tests/, and every pytest call mutmut makes gets `-m "not sweep"`. The mutants
# and their names are the same; the results go to a folder of their own,
# build/mutation/TARGET[-decorated]-suite/, so that the listed-files runs' results
# stay as they were. mutmut's first run of a whole suite (to learn which tests call
# which function) takes as long as the suite run by one process.
source "$(dirname "$0")/_env.sh"
export JAX_PLATFORMS=cpu JAX_CHECK_TRACER_LEAKS=1 QUAX_DEBUG_CHECKS=1
export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

# TARGET  DISTRIBUTION  MODULE (under the distribution's src/)  TESTS (in its tests/)
# Each target's tests are the files that exercise that module, chosen so that one run
# of the unmutated module takes a minute or two: mutmut runs, for each mutant, only
# the tests that called the mutated function, stopping at the first failure.
targets=$(
    cat <<'EOF'
zero-rules       quax-core        quax/zero/_rules.py              test_zero.py test_zero_signs.py test_zero_preserving.py test_zero_conformance.py test_custom_symbolic_zeros.py test_mutants_zero.py
zero-value       quax-core        quax/zero/_value.py              test_zero.py test_zero_signs.py test_zero_conformance.py
caching-keys     quax-core        quax/_caching/_keys.py           test_cache_keys_inputs.py test_cache_keys_types.py test_cache_identity.py test_known_constant.py test_caches.py test_mutants_keys.py
caching-eager    quax-core        quax/_caching/_eager.py          test_eager.py test_cache_keys_inputs.py test_cache_identity.py test_mutants_caching.py test_mutants_eager.py
caching-replay   quax-core        quax/_caching/_replay.py         test_replay.py test_cache_identity.py test_caches.py test_mutants_caching.py
caching-per-jaxpr quax-core       quax/_caching/_per_jaxpr.py      test_caches.py test_cache_lifetime.py test_built_inside.py test_nesting.py test_control_flow.py test_mutants_per_jaxpr.py test_mutants_caching.py
caching-nested   quax-core        quax/_caching/_nested.py         test_nesting.py test_cache_lifetime.py test_caches.py test_cache_identity.py test_mutants_caching.py
transform-interpreter quax-core   quax/_transform/_interpreter.py  test_nesting.py test_cache_lifetime.py test_cache_identity.py test_trace_fast.py test_custom_derivatives.py test_sharding.py test_joins.py test_known_constant.py test_mutants_interpreter.py
dispatch-known   quax-core        quax/_dispatch/_known.py         test_known_constant.py test_known_scaled_constant.py test_known_scaled_constant_edges.py test_mutants_known.py test_nesting.py test_cache_identity.py
dispatch-registry quax-core       quax/_dispatch/_registry.py      test_registry.py test_clients_registry.py test_cache_keys_types.py test_register_function_inline.py test_mutants_trace.py test_quaxify.py test_loop_fills.py
dispatch-staged  quax-core        quax/_dispatch/_staged.py        test_registry.py test_quaxify.py test_built_inside.py test_nesting.py test_mutants_staged.py test_bound_values.py
dispatch-plugins quax-core        quax/_dispatch/_plugins.py       test_plugins.py test_plugin_faults.py test_plugin_trace_context.py test_mutants_plugins.py
transform-trace  quax-core        quax/_transform/_trace.py        test_quaxify.py test_nesting.py test_values.py test_sharding.py test_bound_values.py test_mutants_trace.py test_register_function_inline.py
transform-quaxify quax-core       quax/_transform/_quaxify.py      test_quaxify.py test_nesting.py test_built_inside.py test_mutants_quaxify.py test_built_from_constants.py test_eager.py
lora-rules       quax-lora        quax_lora/_rules.py              test_rules.py test_dot_general.py test_multi_adapter.py test_variants.py test_mutants_rules.py test_value_weights.py
quant-rules      quax-quant       quax_quant/_rules.py             test_rules.py test_matmul.py test_gptq.py test_mutants_rules.py
named-rules      quax-named       quax_named/_rules.py             test_rules.py test_operators.py test_joins.py test_mutants_rules.py test_loops.py
units-rules      quax-units       quax_units/_rules/_arrays.py     test_rules.py test_operators.py test_mutants_rules.py
units-functions  quax-units       quax_units/_rules/_functions.py  test_rules.py test_rounding.py test_angle_conversions.py test_functions_transforms.py test_angle_derivatives.py test_mutants_rules.py
units-linalg     quax-units       quax_units/_rules/_linalg.py     test_linalg.py
sparse-rules     quax-sparse      quax_sparse/_rules.py            test_rules.py test_elementwise.py test_dot_general.py test_block_sparse.py test_solver_route.py test_mutants_rules.py test_ndense_ops.py
structured-rules quax-structured  quax_structured/_rules.py        test_rules.py test_values.py test_small_det.py test_kronecker_noise.py test_traced_noise.py test_composite.py test_mutants_rules.py
EOF
)

decorated=
suite=
while [ "${1:-}" = --decorated ] || [ "${1:-}" = --suite ]; do
    [ "$1" = --decorated ] && decorated=1
    [ "$1" = --suite ] && suite=1
    shift
done
if [ $# -eq 0 ] || [ "$1" = list ]; then
    echo "$targets"
    exit 0
fi
target=$1
shift
row=$(awk -v t="$target" '$1 == t' <<<"$targets")
if [ -z "$row" ]; then
    echo "unknown target '$target'; the targets:" >&2
    echo "$targets" >&2
    exit 2
fi
read -r _ dist module tests <<<"$row"

root=$PWD
work=build/mutation/$target${decorated:+-decorated}${suite:+-suite}
mkdir -p "$work"
# The distribution's sources and tests, copied afresh (mutmut's own results, under
# mutants/, are kept between runs).
rm -rf "$work/src" "$work/tests" "$work/mutants/tests" "$work/$dist" "$work/mutants/$dist"
cp -r "$dist/src" "$work/src"
if [ -n "$suite" ]; then
    # The whole suite runs as in the checkout, from $dist/tests/ under the root: pytest
    # names a test module after its path (`quax-units.tests.test_quantity`), and a
    # rule a test registers is owned by that name's first part, the family's
    # distribution (a test that re-registers a family's rule relies on it), and a
    # test may read a file beside tests/ (quax-structured's README.md).
    mkdir "$work/$dist"
    cp -r "$dist/tests" "$work/$dist/tests"
    [ -f "$dist/README.md" ] && cp "$dist/README.md" "$work/$dist/"
    tests_copy=$work/$dist
else
    cp -r "$dist/tests" "$work/tests"
    tests_copy=$work/tests
fi
cp conftest.py "$work/conftest.py"
find "$work/src" "$tests_copy" -name __pycache__ -prune -exec rm -rf {} +
if [ -n "$decorated" ]; then
    "$root/.venv/bin/python" "$root/scripts/mutation_decorated.py" rewrite "$work/src/$module"
fi

# mutmut's settings, and the root's pytest settings (warnings are errors, the markers),
# which the copy's tests run under: mutmut runs pytest in the copy's mutants/ folder.
# With --suite, the whole of the distribution's tests/ but the sweeps, as CI runs it
# (scripts/test.sh): `-m "not sweep"` goes with every pytest call mutmut makes.
if [ -n "$suite" ]; then
    selection="\"$dist/tests\", "
    marks='"-m", "not sweep", '
else
    selection=$(printf '"tests/%s", ' $tests)
    marks=
fi
{
    sed -n '/^\[tool.pytest.ini_options\]/,/^\[tool.ruff\]/p' pyproject.toml | sed '$d'
    cat <<EOF
[tool.mutmut]
source_paths = ["src"]
only_mutate = ["src/$module"]
also_copy = ["conftest.py"${suite:+, \"$dist\"}]
pytest_add_cli_args_test_selection = [${selection%, }]
# Where a process imported quax before pytest started, pytest cannot rewrite the
# asserts of quax.testing's pytest plugin and warns (an error, as every warning).
pytest_add_cli_args = [$marks"-p", "no:cacheprovider", "-p", "no:xdist", "--hypothesis-seed=0", "-W", "ignore::pytest.PytestAssertRewriteWarning"]
# Each mutant's tests run in a process forked from a server that has imported
# nothing of the tests' (\`forkserver_warmup = "none"\`), never from mutmut's own
# process: that one ran the tests, and JAX's runtime threads do not survive a fork
# (the child deadlocks). Nor may the server import quax or a family ahead: their
# import runs code of the mutated modules (\`register\` and the functions that
# register rules, \`add_setting\`), which would then run unmutated, and every mutant
# of it would survive unseen.
process_isolation = "forkserver"
forkserver_warmup = "none"
# A mutant's tests time out after 5 times (their unmutated duration + 10 s): each
# worker collects its tests and compiles its programs anew.
timeout_multiplier = 5.0
timeout_constant = 10.0
EOF
} >"$work/pyproject.toml"
# Compiled programs are kept on disk (JAX's persistent cache), so that each worker
# reads back the programs the unmutated run compiled.
export JAX_COMPILATION_CACHE_DIR="$root/build/mutation/jax-cache"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0

cd "$work"
if [ "${1:-}" = names ] || [ "${1:-}" = sample ]; then
    # Every mutant's name, as `mutmut run` will name it: mutmut's own mutation of the
    # module's source, parsed only (nothing is imported or run).
    if [ -n "$decorated" ]; then
        # Only the mutants inside the functions that carried a decorator.
        names=$("$root/.venv/bin/python" "$root/scripts/mutation_decorated.py" names "src/$module" "src/$module")
    else
        names=$(
            "$root/.venv/bin/python" - "src/$module" <<'EOF'
import sys
from pathlib import Path

from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name

path = Path(sys.argv[1])
for name in mutate_file_contents(str(path), path.read_text()).mutant_names:
    print(get_mutant_name(path, name))
EOF
        )
    fi
    if [ "$1" = sample ] && [ $# -ne 3 ]; then
        echo "usage: bash scripts/mutation.sh TARGET sample N SEED" >&2
        exit 2
    fi
    seed=${2:-}
    [ "$1" = sample ] && seed=$3
    if [ -n "$seed" ]; then
        names=$(
            "$root/.venv/bin/python" -c '
import random
import sys

names = sorted(sys.stdin.read().split())
random.Random(int(sys.argv[1])).shuffle(names)
print("\n".join(names))
' "$seed" <<<"$names"
        )
    fi
    if [ "$1" = names ]; then
        echo "$names"
        exit 0
    fi
    echo "$target: $(wc -l <<<"$names") mutants of $module${decorated:+ inside decorated functions}${suite:+, against all of $dist/tests/}; a uniform sample of $2 (seed $3):"
    sample=$(head -n "$2" <<<"$names")
    echo "$sample"
    # shellcheck disable=SC2086 # one mutant name a line, no spaces
    set -- $sample
fi
max_children=(--max-children 1)
for arg in "$@"; do
    [ "$arg" = --max-children ] && max_children=()
done
nice -n 15 "$root/.venv/bin/mutmut" run "${max_children[@]}" "$@"
