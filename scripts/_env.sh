# Sourced by the other scripts: make sure uv is there, then build `.venv` at the
# repository root from the lock file, with every distribution installed editable.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
UV_VERSION=0.13.9
if ! command -v uv >/dev/null 2>&1 || [ "$(uv --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
    python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
    export PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
fi
uv sync --locked --quiet
