#!/usr/bin/env bash
# quax-lora's peft adapters against the real peft (not part of CI): an adapter
# saved with save_adapter(format="peft") is loaded by peft's
# PeftModel.from_pretrained into an equivalent torch model and gives our outputs,
# and one saved by peft's save_pretrained is loaded by load_adapter and gives
# torch's, for LoRA, rsLoRA and DoRA (scripts/peft_roundtrip.py says how).
#
#   bash scripts/peft_roundtrip.sh
#
# peft and torch (run on the CPU) go into a venv of their own, installed with pip
# (so pip's own configuration, say a find-links folder of wheels, applies); it is
# kept in .peft-venv (ignored by git; PEFT_VENV=... for another folder; remove it
# to reinstall). TORCH_SPEC names what to install for torch (default
# torch==2.13.0; a path to a wheel works too), PEFT_SPEC for peft (default: the
# newest). Exit status: non-zero when an output differs beyond the float32
# tolerance.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v uv >/dev/null || { echo "scripts/peft_roundtrip.sh needs uv (pip install uv)" >&2; exit 2; }
venv=${PEFT_VENV:-.peft-venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
peft_spec=${PEFT_SPEC:-peft}
if [ ! -x "$venv/bin/python" ]; then
    echo "== installing $torch_spec and $peft_spec into $venv"
    uv venv --quiet --seed --python 3.11 "$venv"
    "$venv/bin/python" -m pip install --quiet "$torch_spec" "$peft_spec" numpy safetensors
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export JAX_PLATFORMS=cpu
echo "== quax-lora: our adapters"
uv run --locked --no-sync python scripts/peft_roundtrip.py write "$work"
echo "== peft: our adapters in peft, and peft's own"
"$venv/bin/python" scripts/peft_roundtrip.py check "$work"
echo "== quax-lora: peft's adapters"
uv run --locked --no-sync python scripts/peft_roundtrip.py read "$work"
