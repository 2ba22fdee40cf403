#!/usr/bin/env bash
# Make sure Debian's nginx is installed (the admission tests and benchmark run it as a
# gateway with auth_request, each as a child process with its own prefix and config).
# Idempotent: does nothing when nginx is on PATH with the auth_request module.
set -euo pipefail

NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
if [[ -x $NGINX ]] && "$NGINX" -V 2>&1 | grep -q http_auth_request_module; then
    echo "nginx-bin: $("$NGINX" -v 2>&1)"
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    SUDO="sudo"
fi

echo "nginx-bin: installing Debian's nginx package"
# The package would start a system-wide nginx on port 80; the tests start their own on
# loopback. Keep the service from starting during the install.
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=0
if [[ ! -e $POLICY ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
    ADDED_POLICY=1
fi
cleanup() { if [[ $ADDED_POLICY -eq 1 ]]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends nginx >/dev/null
echo "nginx-bin: $(/usr/sbin/nginx -v 2>&1)"
