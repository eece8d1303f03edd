#!/usr/bin/env bash
# quax on an accelerator (TPU or GPU): the wheels of this checkout installed beside
# that machine's own JAX, and the test suites and benchmarks run on its backend.
#
# Two sides, one script:
#
#   bash scripts/accel.sh prepare
#       here, on the development machine (registry access, uv): builds a wheel of every
#       distribution into .accel/proj and downloads, for Python 3.11 on x86_64 Linux, the
#       third-party wheels at uv.lock's versions that the accelerator machine lacks into
#       .accel/deps (JAX, jaxlib, NumPy and SciPy are that machine's own: its JAX is
#       built for its runtime). `.accel/` is ignored by git (.gitignore); send it along.
#
#   bash scripts/accel.sh COMMAND [ARGS...]
#       there, on the accelerator machine (no registry): installs .accel's wheels into
#       .accel/site (once per machine), appends it to PYTHONPATH (which points at the
#       machine's JAX: never replaced), and runs COMMAND on the accelerator backend
#       (`JAX_PLATFORMS` unset):
#         suite [PART]      the accelerator suite: quax-core's suite and every family's
#                           conformance and numerical tests (scripts/accel-suite.txt),
#                           in one process; PART (core, lora, named, quant, sparse,
#                           structured, units) runs only its lines, one call of 10
#                           minutes each on a TPU v5e (whose compiles make the whole
#                           suite take several);
#         full SLICE        one full suite: core, root, or a family's name (lora,
#                           sparse, units, quant, structured, named); like
#                           `suite`, without the tests marked `sweep` (as CI);
#         pytest ARGS...    pytest on ARGS, with the suites' settings;
#         bench ARGS...     benchmarks/run.py ARGS (e.g. --quick), figures with the
#                           device kind;
#         python ARGS...    python with the wheels installed (a single benchmark).
#       Logs, JUnit XML and benchmark results go under $OUT (the accelerator tool's
#       folder that comes back; ./accel-out where it is unset), written as they come,
#       so that a call cut at its time limit still returns what it ran. Pytest is
#       stopped with SIGINT `ACCEL_PYTEST_LIMIT` seconds in (default 540), so that it
#       prints its summary before the call's limit.
#
# Only one process can hold a TPU: nothing here runs pytest-xdist. The same commands
# run unchanged on a GPU machine with the same layout (its JAX with CUDA installed).
set -euo pipefail
cd "$(dirname "$0")/.."

accel=.accel
command=${1:-}
[ -n "$command" ] || { sed -n '2,39p' "$0"; exit 2; }
shift

if [ "$command" = prepare ]; then
    source scripts/_env.sh
    rm -rf "$accel/proj" "$accel/deps"
    mkdir -p "$accel/proj" "$accel/deps"
    for d in quax-*/; do
        uv build --quiet --package "${d%/}" --wheel --out-dir "$accel/proj"
    done
    # Everything the distributions, the test suites and the tour (its plots) need, at
    # uv.lock's versions, but what the accelerator machine has built for it (JAX,
    # jaxlib, NumPy, SciPy, ml_dtypes, opt_einsum), what only the development machine
    # uses (linters, the documentation site, pytest-xdist), and flax's checkpointing
    # (orbax, tensorstore and theirs: 25 MB that nothing here imports; what travels
    # with the checkout is limited to 64 MiB). The wheel builder (hatchling) goes: the
    # plugin tests install their fixture distributions from source with pip.
    skip=(jax jaxlib numpy scipy ml-dtypes opt-einsum
        ruff pyright nodeenv uv pytest-xdist execnet
        mkdocs mkdocs-material mkdocs-material-extensions mkdocstrings mkdocstrings-python
        mkdocs-autorefs mkdocs-get-deps griffelib babel backrefs colorama ghp-import jinja2
        markdown markupsafe mergedeep paginate pymdown-extensions pyyaml-env-tag watchdog
        requests certifi charset-normalizer idna urllib3 click
        orbax-checkpoint tensorstore aiofiles humanize nest-asyncio protobuf simplejson
        uvloop prometheus-client psutil)
    no_emit=()
    for p in "${skip[@]}"; do no_emit+=(--no-emit-package "$p"); done
    # The lock's requirements whose markers hold on the accelerator machine (CPython
    # 3.11 on x86_64 Linux; the lock pins some packages per Python version).
    reqs=$(uv export --frozen --quiet --no-hashes --no-emit-workspace --all-packages \
        --group dev "${no_emit[@]}" | uv run --locked --no-sync python -c '
import sys
from packaging.requirements import Requirement
env = {"python_version": "3.11", "python_full_version": "3.11.7",
       "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix"}
for line in sys.stdin:
    if line[:1].isalnum():
        r = Requirement(line.strip())
        if r.marker is None or r.marker.evaluate(env):
            print(f"{r.name}{r.specifier}")
')
    # shellcheck disable=SC2086
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --python-version 3.11 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$accel/deps" $reqs
    du -sh "$accel"
    exit 0
fi

out=${OUT:-$PWD/accel-out}
mkdir -p "$out"
export PIP_CONFIG_FILE=/dev/null PYTHONUNBUFFERED=1
site="$PWD/$accel/site"
stamp=$(cat "$accel"/proj/*.whl "$accel"/deps/*.whl | md5sum | cut -d' ' -f1)
if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$site"
    python3 -m pip install --isolated -q --no-index --no-deps --no-compile \
        --no-cache-dir --target "$site" "$accel"/deps/*.whl "$accel"/proj/*.whl
    echo "$stamp" >"$site/.stamp"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
unset JAX_PLATFORMS
# JAX's persistent compilation cache: a later call on the same machine reads back what
# an earlier one compiled.
export JAX_COMPILATION_CACHE_DIR="$PWD/$accel/jax-cache"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0

python3 - <<'EOF' | tee "$out/device.txt"
import datetime, jax, jaxlib
d = jax.devices()[0]
print(f"{datetime.date.today()} backend={jax.default_backend()} device={d.device_kind} "
      f"count={jax.device_count()} jax={jax.__version__} jaxlib={jaxlib.__version__}")
EOF

# The test suites' settings (scripts/test.sh) but the CPU-only XLA flags. Two warnings
# are not the code's: the TPU runtime's, that transparent hugepages are off, and the
# deprecation that the machine's own `mypy_extensions` gives where hypothesis imports
# it to report a failing example (under warnings as errors, that stopped a whole run).
pytest_args=(-q -p no:cacheprovider --hypothesis-seed=0 --durations=25
    -W "ignore:Transparent hugepages:UserWarning"
    -W "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning")

run_pytest() {
    local name=$1
    shift
    local limit=${ACCEL_PYTEST_LIMIT:-540}
    echo "== pytest ($name): $*" | tee "$out/$name.log"
    set +e
    # The suites' checks, for pytest only: a benchmark timed under them measures the
    # checks (quax's debug checks cost tracing time), and JAX's leak checker fails
    # lineax's own tridiagonal solve (an `IndexError` inside its report; JAX 0.10.2,
    # on the CPU as on the TPU), which `benchmarks/structured.py` times.
    timeout --signal=INT --kill-after=30 "$limit" \
        env JAX_CHECK_TRACER_LEAKS=1 QUAX_DEBUG_CHECKS=1 python3 -m pytest \
        "${pytest_args[@]}" --junitxml="$out/$name.xml" "$@" 2>&1 |
        tee -a "$out/$name.log" | tail -60
    local rc=${PIPESTATUS[0]}
    set -e
    echo "== pytest ($name) exit status $rc" | tee -a "$out/$name.log"
    return "$rc"
}

case "$command" in
    suite)
        # A part: the lines of its distribution (paths and `--ignore=` options).
        part=${1:-}
        [ -z "$part" ] || shift
        mapfile -t paths < <(grep -vE '^\s*(#|$)' scripts/accel-suite.txt |
            grep -E "^(--ignore=)?quax-${part:-[a-z]+}/")
        [ "${#paths[@]}" -gt 0 ] || { echo "no suite part: $part" >&2; exit 2; }
        run_pytest "suite${part:+-$part}" -m "not sweep" "${paths[@]}" "$@"
        ;;
    full)
        slice=${1:?full needs a slice: core, root, lora, sparse, units, quant, structured, named}
        shift
        case "$slice" in
            core) paths=(quax-core/tests) ;;
            root) paths=(tests) ;;
            *) paths=("quax-$slice/tests") ;;
        esac
        run_pytest "full-$slice" -m "not sweep" "${paths[@]}" "$@"
        ;;
    pytest)
        run_pytest pytest "$@"
        ;;
    bench)
        python3 benchmarks/run.py "$@" 2>&1 | tee "$out/bench.log"
        cp -r benchmarks/results "$out/" 2>/dev/null || true
        ;;
    python)
        # One log per script (a call may run several benchmarks, one after another).
        python3 "$@" 2>&1 | tee "$out/$(basename "$1" .py).log"
        cp -r benchmarks/results "$out/" 2>/dev/null || true
        ;;
    *)
        echo "unknown command: $command" >&2
        exit 2
        ;;
esac
