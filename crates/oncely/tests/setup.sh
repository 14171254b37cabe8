#!/usr/bin/env bash
# Installs what the oncely binary's docs tests run: the PyPI openapi-spec-validator, which
# checks that the admin API's /openapi.json is valid OpenAPI 3.1 (a venv under the cargo
# target dir). Idempotent: a second run only checks.
#
#   crates/oncely/tests/setup.sh
#
# The tests find the venv at ${CARGO_TARGET_DIR:-<workspace>/target}/docs-venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venv="$target/docs-venv"
py="${PYTHON:-python3}"

# A system Python that already has it will do (the tests try python3 last).
if "$py" -c 'import openapi_spec_validator' 2>/dev/null; then
    echo "oncely docs test deps ready: $("$py" -c 'import sys; print(sys.executable)')"
    exit 0
fi
if ! "$venv/bin/python" -c 'import openapi_spec_validator' 2>/dev/null; then
    mkdir -p "$target"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check openapi-spec-validator==0.9.0
fi
"$venv/bin/python" -c 'import openapi_spec_validator'
echo "oncely docs test deps ready: $venv"
