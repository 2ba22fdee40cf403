#!/usr/bin/env bash
# Make sure Debian's prometheus and promtool are installed (used by the test harness
# and the demo). Idempotent: does nothing when both are on PATH.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "prometheus-bin: $(prometheus --version 2>&1 | head -1)"
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    SUDO="sudo"
fi

echo "prometheus-bin: installing Debian's prometheus package"
# The package would start a system-wide Prometheus on all interfaces; the harness
# starts its own on loopback. Keep the service from starting during the install.
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
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
echo "prometheus-bin: $(prometheus --version 2>&1 | head -1)"
