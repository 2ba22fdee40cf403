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

# shellcheck source=hack/cluster/apt-install.sh
source "$(dirname "$0")/apt-install.sh"
apt_install nginx-bin nginx
echo "nginx-bin: $(/usr/sbin/nginx -v 2>&1)"
