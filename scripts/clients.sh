#!/usr/bin/env bash
# The published quax's clients on quax-core: install unxt and quaxed (versions in
# clients/requirements.txt) with their test dependencies beside quax-core, and run their
# own test suites, unmodified, from their sdists, with their own pytest settings.
#
#   bash scripts/clients.sh [quax-core|published|both|subset] [PYTEST_ARGS...]
#
# `quax-core` (the default): this checkout's quax-core and quax-lora (which provides
#   `quax.examples.lora`, as the published quax does), installed editable. The clients
#   require the distribution `quax`; clients/overrides.txt drops that requirement, so the
#   published `quax` is never installed over quax-core's `quax` package.
# `published`: the same suites on the published `quax==0.4.6`, for reference counts.
# `both`: one after the other.
# `subset`: quax-core, running only the test paths clients/subset.txt lists per client
#   (the ones that dispatch through quax on the clients' own value types), fast
#   enough for CI.
# Third-party versions are pinned to uv.lock where it has them (JAX 0.10.2, ...).
# Needs only PyPI. Exit status: non-zero when a quax-core run has a failure or an error,
# other than the strict xfails that pass on quax-core listed in clients/xpass.txt.
# Set QUAX_CLIENTS_KEEP=1 to keep the temporary folder (venvs, logs) for inspection.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$PWD
mode=${1:-quax-core}
[ $# -gt 0 ] && shift
case $mode in
quax-core | published | both | subset) ;;
*)
    echo "usage: bash scripts/clients.sh [quax-core|published|both|subset] [PYTEST_ARGS...]" >&2
    exit 2
    ;;
esac
command -v uv >/dev/null || { echo "scripts/clients.sh needs uv (pip install uv)" >&2; exit 2; }

work=$(mktemp -d)
if [ "${QUAX_CLIENTS_KEEP:-0}" = 1 ]; then
    echo "== keeping $work"
else
    trap 'rm -rf "$work"' EXIT
fi
pins="$work/pins.txt"
uv export --frozen --quiet --no-hashes --no-emit-workspace --all-packages >"$pins"
clients=$(grep -E '^(unxt|quaxed)==' clients/requirements.txt)

echo "== sdists: $(echo $clients)"
# pip downloads an sdist only after building its metadata: quaxed's build hook
# imports JAX, so the download runs in a small venv holding the build backends and JAX.
uv venv --quiet --python 3.11 "$work/tools"
uv pip install --quiet --python "$work/tools/bin/python" -c "$pins" \
    pip hatchling hatch-vcs jax
for c in $clients; do
    "$work/tools/bin/python" -m pip download --quiet --disable-pip-version-check \
        --no-binary :all: --no-deps --no-build-isolation "$c" -d "$work/sdist"
done

run_suites() {  # run_suites FLAVOUR PIP_ARGS...: a venv, then each client's suite
    local flavour=$1 venv="$work/$1"
    shift
    echo "== $flavour: installing"
    uv venv --quiet --python 3.11 "$venv"
    uv pip install --quiet --python "$venv/bin/python" -c "$pins" \
        -r clients/requirements.txt "$@"
    "$venv/bin/python" - "$flavour" <<'EOF'
import importlib.metadata as md, sys
import quax
names = {d.metadata["Name"] for d in md.distributions()}
core = "quax-core" in names
assert core == (sys.argv[1] == "quax-core"), names & {"quax", "quax-core"}
assert ("quax" in names) != core, "exactly one of quax and quax-core is installed"
print(f"   quax {quax.__version__} from {'quax-core' if core else 'quax'}")
EOF
    for c in $clients; do
        local name=${c%%==*} src="$work/$flavour-${c/==/-}"
        mkdir -p "$src"
        tar -xzf "$work/sdist/${c/==/-}.tar.gz" -C "$src" --strip-components=1
        local paths=()
        if [ "$mode" = subset ]; then
            read -r -a paths <<<"$(awk -v n="$name" '$1 == n { $1 = ""; print }' clients/subset.txt)"
        fi
        echo "== $flavour: $c's own test suite ${paths[*]}"
        local start=$SECONDS rc=0 log="$work/$flavour-$name.log"
        # The clients are installed (not editable): a doctest module given by its path
        # in the sdist is imported from site-packages, the same file, which pytest
        # would refuse as an import mismatch.
        (cd "$src" && JAX_PLATFORMS=cpu PY_IGNORE_IMPORTMISMATCH=1 \
            "$venv/bin/python" -m pytest -q "${paths[@]}" "${PYTEST_ARGS[@]}") \
            >"$log" 2>&1 || rc=$?
        grep -E '^(FAILED|ERROR|XPASS)' "$log" || true
        local summary
        summary=$(tail -n 1 "$log")
        echo "   $summary [exit $rc, $((SECONDS - start)) s]"
        results+=("$flavour | $c | $summary")
        if [ "$flavour" = quax-core ] && [ "$rc" != 0 ]; then
            if only_listed_xpasses "$log"; then
                echo "   (its failures are the strict XPASSes clients/xpass.txt lists)"
            else
                status=1
            fi
        fi
    done
}

only_listed_xpasses() {  # only_listed_xpasses LOG: pytest's only failures are listed
    # strict XPASSes (clients/xpass.txt), each reported as `[XPASS(strict)]`
    local failed strict
    failed=$(grep -E '^(FAILED|ERROR) ' "$1" | awk '{ print $2 }' | sort -u || true)
    [ -n "$failed" ] || return 1
    strict=$(grep -B1 -F '[XPASS(strict)]' "$1" | sed -nE 's/^_+ (.*) _+$/\1/p' | sort -u || true)
    local id
    for id in $failed; do
        grep -qxF "$id" clients/xpass.txt || return 1
        grep -qxF "${id##*::}" <<<"$strict" || return 1
    done
}

PYTEST_ARGS=("$@")
results=()
status=0
if [ "$mode" != published ]; then
    run_suites quax-core --overrides clients/overrides.txt \
        -e "$repo/quax-core" -e "$repo/quax-lora"
fi
if [ "$mode" = published ] || [ "$mode" = both ]; then
    run_suites published "quax==0.4.6" beartype
fi
echo "== summary"
printf '%s\n' "${results[@]}"
exit $status
