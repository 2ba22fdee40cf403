#!/usr/bin/env bash
# Make sure Debian's prometheus and promtool are installed (used by the test harness
# and the demo). Idempotent: does nothing when both are on PATH.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "prometheus-bin: $(prometheus --version 2>&1 | head -1)"
    exit 0
fi

# shellcheck source=hack/cluster/apt-install.sh
source "$(dirname "$0")/apt-install.sh"
apt_install prometheus-bin prometheus
echo "prometheus-bin: $(prometheus --version 2>&1 | head -1)"
