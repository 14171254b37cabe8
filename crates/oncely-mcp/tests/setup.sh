#!/usr/bin/env bash
# Installs what oncely-mcp's interop tests run: the official Python MCP SDK (`mcp` on
# PyPI, in a venv under the cargo target dir) and the TypeScript SDK with
# server-everything (npm, under tests/node). Idempotent: a second run only checks.
#
#   crates/oncely-mcp/tests/setup.sh
#
# The tests find the venv at ${CARGO_TARGET_DIR:-<workspace>/target}/mcp-venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venv="$target/mcp-venv"
py="${PYTHON:-python3}"

if ! "$venv/bin/python" -c 'import mcp, uvicorn' 2>/dev/null; then
    mkdir -p "$target"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check mcp==2.3.0 uvicorn==0.54.0
fi
"$venv/bin/python" -c 'import mcp, uvicorn' 

if command -v npm >/dev/null 2>&1; then
    if [ ! -d "$here/node/node_modules/@modelcontextprotocol/sdk" ]; then
        (cd "$here/node" && npm ci --no-audit --no-fund --silent)
    fi
else
    echo "setup.sh: npm not found: the TypeScript SDK tests need Node.js and npm" >&2
fi
echo "oncely-mcp test deps ready: $venv"
