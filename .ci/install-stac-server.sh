#!/usr/bin/env bash
# Install what the STAC API server tests need (tests/stac_servers.py):
#   - Debian's PostgreSQL 15 + PostGIS 3 (binaries only; the tests run their own throw-away cluster),
#   - a SEPARATE virtualenv with stac-fastapi-pgstac, pypgstac[psycopg] and uvicorn
#     (pypgstac pins cachetools<6.1, which would downgrade the dask stack in the project's venv).
#
# Idempotent and quick when everything is already there. Run as root (CI runs as root).
#   RASTERFLOW_STAC_VENV   where the server venv goes (default /opt/rasterflow-stac-venv)
#   RASTERFLOW_STAC_PYTHON the Python used to create it (default: the first of python3.11, python3.12, python3
#                          that has venv + ensurepip)
set -euo pipefail

VENV="${RASTERFLOW_STAC_VENV:-/opt/rasterflow-stac-venv}"
PG_BIN=/usr/lib/postgresql/15/bin

# Pinned to the major (0.x: minor) versions verified to work together here.
PIP_SPECS=(
    "stac-fastapi-pgstac>=7,<8"
    "pypgstac[psycopg]>=0.10,<0.11"
    "uvicorn>=0.30,<1"
)

start=$(date +%s)

# --- PostgreSQL 15 + PostGIS -------------------------------------------------------------------------------------
need_apt=0
[[ -x "$PG_BIN/initdb" && -x "$PG_BIN/pg_ctl" && -x "$PG_BIN/postgres" ]] || need_apt=1
[[ -f /usr/share/postgresql/15/extension/postgis.control ]] || need_apt=1
if [[ $need_apt == 1 ]]; then
    echo "install-stac-server: installing postgresql-15 and postgresql-15-postgis-3 with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    # The Debian package creates and starts a "main" cluster on port 5432 when it can; the tests never use it
    # (they initdb their own cluster on a free port), so whether it exists or runs does not matter.
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql-15 postgresql-15-postgis-3 >/dev/null
fi

# --- the server venv ---------------------------------------------------------------------------------------------
venv_ok() {
    [[ -x "$VENV/bin/python" && -x "$VENV/bin/pypgstac" && -x "$VENV/bin/uvicorn" ]] || return 1
    "$VENV/bin/python" - "${PIP_SPECS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
for spec in sys.argv[1:]:
    req = Requirement(spec)
    if not req.specifier.contains(version(req.name), prereleases=True):
        sys.exit(1)
import stac_fastapi.pgstac.app  # noqa: F401  (imports cleanly)
EOF
}

pick_python() {
    # A Python >= 3.11 that can create venvs (Debian's python3 lacks ensurepip without python3-venv).
    local c
    for c in "${RASTERFLOW_STAC_PYTHON:-}" python3.11 python3.12 python3 /usr/bin/python3; do
        [[ -n "$c" ]] && command -v "$c" >/dev/null 2>&1 || continue
        if "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

if ! venv_ok; then
    PY=$(pick_python) || {
        echo "install-stac-server: no Python >= 3.11 with venv support found (set RASTERFLOW_STAC_PYTHON)" >&2
        exit 1
    }
    echo "install-stac-server: creating $VENV with $PY ($("$PY" --version 2>&1))"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "${PIP_SPECS[@]}" packaging
    venv_ok || { echo "install-stac-server: $VENV does not satisfy ${PIP_SPECS[*]}" >&2; exit 1; }
fi

# --- report ------------------------------------------------------------------------------------------------------
echo "postgres:            $("$PG_BIN/postgres" --version)"
echo "postgis:             $(sed -n "s/^default_version *= *'\(.*\)'/\1/p" /usr/share/postgresql/15/extension/postgis.control)"
"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version
for name in ("stac-fastapi-pgstac", "stac-fastapi-api", "pypgstac", "psycopg", "uvicorn"):
    print(f"{name + ':':<20} {version(name)}")
EOF
echo "venv:                $VENV"
echo "install-stac-server: done in $(( $(date +%s) - start )) s"
