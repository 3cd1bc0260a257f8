#!/usr/bin/env bash
# bench/peers/.venv: gpu-share (editable, all extras) with Celery, Redis's client and Ray
# Serve beside it, apart from the project's own .venv so `make test` never sees them.
# Needs `redis-server` and `bwrap` on PATH (apt-get install redis-server bubblewrap).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=bench/peers/.venv
"${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e '.[all]' -r bench/peers/requirements.txt
command -v redis-server >/dev/null || echo "warning: redis-server is not on PATH" >&2
echo "ready: $VENV/bin/python bench/peers/run.py"
