#!/usr/bin/env bash
# Installs what tests/deploy needs; idempotent, quiet when everything is there.
#   - kubernetes-validate (PyPI; brings PyYAML and jsonschema) into the venv
#   - promtool and prometheus (Debian's `prometheus` package), only when missing;
#     the package's service is stopped and disabled: tests start their own.
#   - kubectl must already be on PATH (it is on this machine's image); a missing
#     one is reported, not fetched: no registry here ships it.
#   - the official Node.js client for tests/compat/test_node_client.py: `npm ci`
#     into tests/compat/node/node_modules, exactly as package-lock.json pins it,
#     again only when the lock file changed. Node.js (>= 20) and npm must be on
#     PATH (they are on this machine's image); a missing one is reported.
# Usage: deploy/install-test-deps.sh [VENV]   (default: .venv at the repo root)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
python="$venv/bin/python"

if ! "$python" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
    "$python" -m pip install -q 'kubernetes-validate>=1.31'
fi

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    # Keep the package from starting its service (no effect where none would start).
    policy_rc_d=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
        $sudo chmod +x /usr/sbin/policy-rc.d
        policy_rc_d=created
    fi
    trap 'if [ -n "$policy_rc_d" ]; then $sudo rm -f /usr/sbin/policy-rc.d; fi' EXIT
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # Belt and braces: if a service manager started it anyway, stop it for good.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        $sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1; then
        $sudo service prometheus stop >/dev/null 2>&1 || true
    fi
fi

if ! command -v kubectl >/dev/null 2>&1; then
    echo "install-test-deps: kubectl is not on PATH; tests/deploy needs it (kubectl kustomize)" >&2
    exit 1
fi

node_dir="$root/tests/compat/node"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "install-test-deps: node and npm are not on PATH; tests/compat/test_node_client.py needs them" >&2
    exit 1
fi
# npm ci starts from an empty node_modules every time: run it only when what is installed is not this lock's.
lock_sum="$(sha256sum "$node_dir/package-lock.json" | cut -d' ' -f1)"
installed="$node_dir/node_modules/.popgate-lock-sha256"
if [ "$(cat "$installed" 2>/dev/null)" != "$lock_sum" ]; then
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$lock_sum" >"$installed"
fi
