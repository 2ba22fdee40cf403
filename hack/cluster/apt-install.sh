#!/usr/bin/env bash
# apt_install LABEL PACKAGE: install one of Debian's packages for the test harness without
# starting its system-wide service (the harness starts its own, on loopback). Sourced by
# install-prometheus.sh and install-nginx.sh.

apt_install() {
    local label=$1 package=$2 sudo="" policy=/usr/sbin/policy-rc.d added=0
    if [[ $(id -u) -ne 0 ]]; then
        sudo="sudo"
    fi
    echo "$label: installing Debian's $package package"
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"
        added=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    local status=0
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "$package" >/dev/null; } || status=$?
    if [[ $added -eq 1 ]]; then
        $sudo rm -f "$policy"
    fi
    return $status
}
