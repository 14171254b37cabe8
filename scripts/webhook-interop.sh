#!/usr/bin/env bash
# Runs the webhook interoperability helper with the providers' own libraries
# (`standardwebhooks` and `stripe` from PyPI) in a venv at target/interop-venv,
# created and filled on first use only.
#
#   scripts/webhook-interop.sh setup    # only make sure the venv is ready
#   scripts/webhook-interop.sh sign     # JSON deliveries signed by the official libraries
#   scripts/webhook-interop.sh verify   # reads JSON cases on stdin, verifies each with them
#
# The Rust test `cargo test -p oncely-webhooks --test it interop` drives both directions.
# ONCELY_INTEROP_VENV overrides the venv's place.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ONCELY_INTEROP_VENV:-$root/target/interop-venv}
py=$venv/bin/python
packages=(standardwebhooks==1.1.0 stripe==16.1.0)

ready() { [ -x "$py" ] && "$py" -c 'import standardwebhooks, stripe' 2>/dev/null; }

if ! ready; then
  mkdir -p "$(dirname "$venv")"
  # Two test processes may start at once: one installs, the other waits.
  exec 9>"$venv.lock"
  if command -v flock >/dev/null; then flock 9; fi
  if ! ready; then
    python3 -m venv "$venv" >&2
    "$py" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2 ||
      { echo "webhook-interop: pip could not install ${packages[*]}" >&2; exit 1; }
  fi
  exec 9>&-
fi

case "${1:-}" in
  setup) exit 0 ;;
  sign | verify) exec "$py" "$root/crates/oncely-webhooks/tests/interop/interop.py" "$1" ;;
  *) echo "usage: $0 setup|sign|verify" >&2; exit 2 ;;
esac
