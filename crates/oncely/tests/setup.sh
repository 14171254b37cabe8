#!/usr/bin/env bash
# Installs what the oncely binary's integration tests run with Python, in venvs under the
# cargo target dir. Idempotent: a second run only checks.
#
# - docs-venv: the PyPI openapi-spec-validator, which checks that the admin API's
#   /openapi.json is valid OpenAPI 3.1;
# - sdk-venv: the real SDKs the sdk_clients tests drive through the gateway (the PyPI
#   openai, anthropic and stripe packages, pinned), and httpx (pinned), whose thread pool
#   of clients the joiners_memory tests send 200 duplicates with;
# - otlp-venv: the PyPI opentelemetry-proto and grpcio packages (pinned), which the OTLP
#   receiver of the telemetry tests (tests/otlp/receiver.py) is built on;
# - tests/sdk/node/node_modules: the npm openai, @anthropic-ai/sdk and stripe packages
#   (pinned in tests/sdk/node/package.json and its lock file; needs Node.js and npm).
#
#   crates/oncely/tests/setup.sh
#
# The tests find them at ${CARGO_TARGET_DIR:-<workspace>/target}/docs-venv and .../sdk-venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
py="${PYTHON:-python3}"

# The docs tests: a system Python that already has the validator will do (the tests try
# python3 last).
venv="$target/docs-venv"
if "$py" -c 'import openapi_spec_validator' 2>/dev/null; then
    echo "oncely docs test deps ready: $("$py" -c 'import sys; print(sys.executable)')"
else
    if ! "$venv/bin/python" -c 'import openapi_spec_validator' 2>/dev/null; then
        mkdir -p "$target"
        "$py" -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check openapi-spec-validator==0.9.0
    fi
    "$venv/bin/python" -c 'import openapi_spec_validator'
    echo "oncely docs test deps ready: $venv"
fi

# The SDK tests: exactly these versions (docs/clients.md says which versions were checked).
sdk_venv="$target/sdk-venv"
sdk_pins=(openai==3.60.0 anthropic==2.16.0 stripe==16.1.0 httpx==0.29.0)
sdk_check='
import sys
from importlib.metadata import version
want = dict(p.split("==") for p in sys.argv[1:])
have = {n: version(n) for n in want}
sys.exit(0 if have == want else 1)
'
# pinned_venv DIR PIN...: a venv at DIR holding exactly these versions (made, or its
# packages installed, only when it does not).
pinned_venv() {
    local dir=$1
    shift
    if ! "$dir/bin/python" -c "$sdk_check" "$@" 2>/dev/null; then
        mkdir -p "$target"
        [ -x "$dir/bin/python" ] || "$py" -m venv "$dir"
        "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
    fi
    "$dir/bin/python" -c "$sdk_check" "$@"
}
pinned_venv "$sdk_venv" "${sdk_pins[@]}"
echo "oncely SDK test deps ready: $sdk_venv (${sdk_pins[*]})"

# The telemetry tests' OTLP receiver: exactly these versions.
otlp_venv="$target/otlp-venv"
otlp_pins=(opentelemetry-proto==1.45.2 grpcio==1.85.3 protobuf==7.36.2)
pinned_venv "$otlp_venv" "${otlp_pins[@]}"
echo "oncely OTLP receiver deps ready: $otlp_venv (${otlp_pins[*]})"

node_dir="$here/sdk/node"
if command -v npm >/dev/null 2>&1; then
    # Installed as package.json pins them? (read from node_modules: the packages'
    # exports do not include their package.json)
    if ! (cd "$node_dir" && node -e '
            const fs = require("fs");
            const pins = JSON.parse(fs.readFileSync("package.json")).dependencies;
            for (const [p, want] of Object.entries(pins)) {
                const have = JSON.parse(fs.readFileSync(`node_modules/${p}/package.json`)).version;
                if (have !== want) process.exit(1);
            }') 2>/dev/null; then
        (cd "$node_dir" && npm ci --no-audit --no-fund --silent)
    fi
    echo "oncely npm SDK test deps ready: $node_dir/node_modules"
else
    echo "setup.sh: npm not found: the npm SDK tests (sdk_clients) need Node.js and npm" >&2
    exit 1
fi
