#!/usr/bin/env bash
# The published artefacts work: build a wheel and an sdist of every distribution, check
# their metadata, install the wheels (not editable) into fresh environments, and run
#   1. with every wheel: the root README's example and examples/lora_finetune.py;
#   2. with only the quax-core and quax-lora wheels: the README's example again, and
#      `quax.examples.sparse` saying which distribution to install.
# Third-party dependencies are pinned to uv.lock's versions.
source "$(dirname "$0")/_env.sh"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dist="$work/dist"
dists=()
for d in quax-*/; do
    dists+=("${d%/}")
done

echo "== build: ${dists[*]}"
for d in "${dists[@]}"; do
    uv build --quiet --package "$d" --out-dir "$dist"
done

echo "== metadata"
uv run --locked --no-sync python - "$dist" "${dists[@]}" <<'EOF'
import email, pathlib, sys, tarfile, zipfile

dist, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
versions = set()
for name in names:
    stem = name.replace("-", "_")
    (wheel,) = dist.glob(f"{stem}-*.whl")
    (sdist,) = dist.glob(f"{stem}-*.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        m = email.message_from_bytes(z.read(meta))
        licensed = any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    with tarfile.open(sdist) as t:
        names_in_sdist = t.getnames()
    problems = []
    for file in ("README.md", "LICENSE"):
        if not any(n.endswith(f"/{file}") for n in names_in_sdist):
            problems.append(f"no {file} in the sdist")
    if m.get("Description-Content-Type") != "text/markdown":
        problems.append("no Markdown long description")
    if len(m.get_payload() or "") < 500:
        problems.append("a long description under 500 characters")
    # PEP 639: an SPDX expression and the license file; PyPI refuses a license
    # classifier beside an expression.
    classifiers = m.get_all("Classifier") or []
    if m.get("License-Expression") != "Apache-2.0" or not licensed:
        problems.append("no License-Expression Apache-2.0 with its LICENSE file")
    if any(c.startswith("License ::") for c in classifiers):
        problems.append("a license classifier beside the license expression")
    if len(classifiers) < 3:
        problems.append("fewer than 3 classifiers")
    if not m.get("Requires-Python") or not m.get("Summary") or not m.get("Keywords"):
        problems.append("no Requires-Python, Summary or Keywords")
    requires = m.get_all("Requires-Dist") or []
    if name != "quax-core" and not any(
        r.replace(" ", "").startswith("quax-core") and "<0.6" in r and ">=0.5.0" in r
        for r in requires
    ):
        problems.append(f"no quax-core>=0.5.0,<0.6 requirement: {requires}")
    versions.add(m["Version"])
    assert not problems, f"{wheel.name}: " + "; ".join(problems)
    print(f"{wheel.name}, {sdist.name}: ok")
assert len(versions) == 1, f"versions move together, but got {sorted(versions)}"
EOF

pins="$work/pins.txt"
uv export --frozen --quiet --no-hashes --no-emit-workspace --all-packages >"$pins"
readme="$work/readme_example.py"
uv run --locked --no-sync python - "$readme" <<'EOF'
import pathlib, re, sys

text = pathlib.Path("README.md").read_text()
block = re.search(r"```python\n(.*?)```", text, re.S)
assert block, "README.md has no python block"
pathlib.Path(sys.argv[1]).write_text(block.group(1))
EOF

fresh_env() {  # fresh_env DIR WHEEL...: a venv holding these wheels, pinned deps
    local venv=$1
    shift
    uv venv --quiet --python 3.11 "$venv"
    uv pip install --quiet --python "$venv/bin/python" -c "$pins" "$@"
}

# The wheels, not this checkout: run from an empty folder, and check where quax is.
run_in() {  # run_in VENV ARGS...
    (cd "$work" && JAX_PLATFORMS=cpu "$1/bin/python" -W error "${@:2}")
}

echo "== every wheel, in a fresh environment"
fresh_env "$work/all" "$dist"/*.whl optax tqdm  # optax, tqdm: lora_finetune.py
run_in "$work/all" -c "import quax, sys; assert sys.prefix in quax.__file__, quax.__file__"
run_in "$work/all" "$readme"
cp examples/lora_finetune.py "$work/"
run_in "$work/all" lora_finetune.py

echo "== only the quax-core and quax-lora wheels"
fresh_env "$work/lora" "$dist"/quax_core-*.whl "$dist"/quax_lora-*.whl
run_in "$work/lora" "$readme"
run_in "$work/lora" - <<'EOF'
import importlib.metadata

import quax

installed = {d.metadata["Name"] for d in importlib.metadata.distributions()}
assert {n for n in installed if n.startswith("quax")} == {"quax-core", "quax-lora"}
assert {f.name for f in quax.plugins.summarise()} == {"zero", "lora"}
try:
    import quax.examples.sparse  # noqa: F401
except ImportError as e:
    assert "quax-sparse" in str(e), e
else:
    raise AssertionError("quax.examples.sparse imported without quax-sparse")
print("quax-core + quax-lora alone: ok")
EOF
echo "== wheels: ok"
