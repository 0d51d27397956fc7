# Sourced by scripts/*: create or reuse the virtual environment and install the project into it.
# Reinstalls only when pyproject.toml changed (a stamp keeps its hash), so reruns are quick.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LEASEKEEPER_VENV:-$ROOT/.venv}"
EXTRAS="${1:-test}"

pick_python() {
    for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$py" ] || continue
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$py"
            return 0
        fi
    done
    echo "leasekeeper needs Python 3.11 or newer on PATH" >&2
    return 1
}

if [ ! -x "$VENV/bin/python" ]; then
    "$(pick_python)" -m venv "$VENV"
fi
stamp="$VENV/.leasekeeper-$EXTRAS"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log="$(mktemp)"
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$EXTRAS]" \
        >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "installing leasekeeper[$EXTRAS] into $VENV failed" >&2
        exit 1
    fi
    rm -f "$log"
    echo "$want" >"$stamp"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
