#!/usr/bin/env bash
# Build the local test cluster's binaries from the pinned Go tools modules in
# hack/cluster/tools/*, into ${PRESCALER_CACHE:-~/.cache/prescaler}/bin.
#
# Idempotent: each binary carries a stamp (hash of its module's go.mod/go.sum,
# the Go version and the build flags); a binary whose stamp matches is not rebuilt.
# Builds run one after another to bound memory; a cold build takes many minutes
# on 2 cores, so progress is printed as it goes.
#
# Usage: hack/cluster/build.sh [--check] [NAME...]   (--check: exit 1 if anything is stale;
# NAMEs: build only those binaries, e.g. what the demo needs first; KEDA's CRDs come with
# keda-operator, the Gateway API Inference Extension's CRDs with kube-apiserver)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS="$HERE/tools"
CACHE="${PRESCALER_CACHE:-$HOME/.cache/prescaler}"
BIN="$CACHE/bin"
STAMPS="$BIN/.stamps"
# Bump to force a rebuild of everything when the way we build changes.
BUILD_REV=1

CHECK_ONLY=0
if [[ "${1:-}" == "--check" ]]; then CHECK_ONLY=1; shift; fi
WANTED=("$@")

if ! command -v go >/dev/null 2>&1; then
    echo "cluster-bin: the 'go' command is needed to build the local cluster (Go >= 1.26)" >&2
    exit 2
fi

mkdir -p "$BIN" "$STAMPS"

# One build at a time per cache (parallel `make` runs would race on the same outputs).
exec 9>"$BIN/.build.lock"
if ! flock -n 9; then
    echo "cluster-bin: another build is running on $BIN; waiting for it"
    flock 9
fi

# name | tools module | package
TARGETS=(
    "etcd|etcd|go.etcd.io/etcd/server/v3"
    "kube-apiserver|kube|k8s.io/kubernetes/cmd/kube-apiserver"
    "kube-controller-manager|kube|k8s.io/kubernetes/cmd/kube-controller-manager"
    "kube-scheduler|kube|k8s.io/kubernetes/cmd/kube-scheduler"
    "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok"
    "kwokctl|kwok|sigs.k8s.io/kwok/cmd/kwokctl"
    "kubectl|kube|k8s.io/kubernetes/cmd/kubectl"
    "helm|helm|helm.sh/helm/v3/cmd/helm"
    "keda-operator|keda|github.com/kedacore/keda/v2/cmd/operator"
    "keda-adapter|keda|github.com/kedacore/keda/v2/cmd/adapter"
    "caddy|caddy|github.com/caddyserver/caddy/v2/cmd/caddy"
)

GO_VERSION="$(go env GOVERSION)"

module_version() { # module dir, module path -> pinned version
    (cd "$TOOLS/$1" && go list -m -f '{{.Version}}' "$2")
}

ldflags_for() { # module dir -> extra -X flags so binaries report their real version
    case "$1" in
        kube)
            local v major minor
            v="$(module_version kube k8s.io/kubernetes)"
            major="${v#v}"; major="${major%%.*}"
            minor="${v#v*.}"; minor="${minor%%.*}"
            local p=k8s.io/component-base/version
            echo "-X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
            ;;
        helm)
            # As helm's own Makefile: its version, and the Kubernetes version it assumes
            # without a cluster (helm template, helm lint) taken from the client-go it is
            # built with (v0.Y.Z is Kubernetes 1.Y); unset, helm assumes v1.20.
            local p=helm.sh/helm/v3 kv major minor
            kv="$(module_version helm k8s.io/client-go)"
            kv="${kv#v}"
            major=$((${kv%%.*} + 1))
            minor="${kv#*.}"; minor="${minor%%.*}"
            echo "-X $p/internal/version.version=$(module_version helm helm.sh/helm/v3)" \
                "-X $p/internal/version.gitTreeState=clean" \
                "-X $p/pkg/lint/rules.k8sVersionMajor=$major -X $p/pkg/lint/rules.k8sVersionMinor=$minor" \
                "-X $p/pkg/chartutil.k8sVersionMajor=$major -X $p/pkg/chartutil.k8sVersionMinor=$minor"
            ;;
        keda)
            # As KEDA's Makefile: the version the operator and adapter log and report
            # (its release images carry the tag without the leading v).
            local v
            v="$(module_version keda github.com/kedacore/keda/v2)"
            echo "-X github.com/kedacore/keda/v2/version.Version=${v#v}"
            ;;
        *) echo "" ;;
    esac
}

stamp_for() { # module dir, ldflags -> stamp string
    cat "$TOOLS/$1/go.mod" "$TOOLS/$1/go.sum" \
        | { cat; echo "$GO_VERSION rev=$BUILD_REV ldflags=$2"; } \
        | sha256sum | cut -c1-16
}

if [[ ${#WANTED[@]} -gt 0 ]]; then
    chosen=()
    for want in "${WANTED[@]}"; do
        found=0
        for t in "${TARGETS[@]}"; do
            if [[ "${t%%|*}" == "$want" ]]; then chosen+=("$t"); found=1; fi
        done
        if [[ $found -eq 0 ]]; then
            echo "cluster-bin: no binary named $want (known: ${TARGETS[*]%%|*})" >&2
            exit 2
        fi
    done
    TARGETS=("${chosen[@]}")
fi

stale=()
for t in "${TARGETS[@]}"; do
    IFS='|' read -r name mod pkg <<<"$t"
    ld="$(ldflags_for "$mod")"
    want="$(stamp_for "$mod" "$ld")"
    if [[ -x "$BIN/$name" && "$(cat "$STAMPS/$name" 2>/dev/null)" == "$want" ]]; then
        continue
    fi
    stale+=("$name|$mod|$pkg|$want|$ld")
done

# KEDA's CRDs, from the pinned module's config/crd/bases, next to the binaries
# (the tests install them into the local cluster): keda.sh's and eventing.keda.sh's, as
# the operator watches both.
KEDA_CRDS="$CACHE/keda/crds"
keda_crds_want="$(stamp_for keda "crds=config/crd/bases/*.yaml")"
keda_crds_stale=1
if [[ "$(cat "$STAMPS/keda-crds" 2>/dev/null)" == "$keda_crds_want" ]] \
    && compgen -G "$KEDA_CRDS/*.yaml" >/dev/null; then
    keda_crds_stale=0
fi
if [[ " ${TARGETS[*]%%|*} " != *" keda-operator "* ]]; then
    keda_crds_stale=0  # not asked for
fi

# The Gateway API Inference Extension's CRDs (config/crd/bases of the pinned module, no
# build): the tests install them beside prescaler's, in every cluster that needs them.
GIE_CRDS="$CACHE/gie/crds"
gie_crds_want="$(stamp_for gie "crds=config/crd/bases/*.yaml")"
gie_crds_stale=1
if [[ "$(cat "$STAMPS/gie-crds" 2>/dev/null)" == "$gie_crds_want" ]] \
    && compgen -G "$GIE_CRDS/*.yaml" >/dev/null; then
    gie_crds_stale=0
fi
if [[ " ${TARGETS[*]%%|*} " != *" kube-apiserver "* ]]; then
    gie_crds_stale=0  # not asked for
fi

if [[ ${#stale[@]} -eq 0 && $keda_crds_stale -eq 0 && $gie_crds_stale -eq 0 ]]; then
    echo "cluster-bin: all ${#TARGETS[@]} binaries are up to date in $BIN"
    exit 0
fi
if [[ $CHECK_ONLY -eq 1 ]]; then
    names=("${stale[@]%%|*}")
    if [[ $keda_crds_stale -eq 1 ]]; then names+=("keda-crds"); fi
    if [[ $gie_crds_stale -eq 1 ]]; then names+=("gie-crds"); fi
    echo "cluster-bin: stale: ${names[*]}" >&2
    exit 1
fi

if [[ $keda_crds_stale -eq 1 ]]; then
    src="$(cd "$TOOLS/keda" && go mod download github.com/kedacore/keda/v2 \
        && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)/config/crd/bases"
    rm -rf "$KEDA_CRDS.tmp"
    mkdir -p "$KEDA_CRDS.tmp"
    cp "$src"/*.yaml "$KEDA_CRDS.tmp/"
    chmod u+w "$KEDA_CRDS.tmp"/*.yaml
    rm -rf "$KEDA_CRDS"
    mv "$KEDA_CRDS.tmp" "$KEDA_CRDS"
    echo "$keda_crds_want" >"$STAMPS/keda-crds"
    echo "cluster-bin: KEDA's CRDs copied into $KEDA_CRDS"
fi
if [[ $gie_crds_stale -eq 1 ]]; then
    src="$(cd "$TOOLS/gie" && go mod download sigs.k8s.io/gateway-api-inference-extension \
        && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api-inference-extension)/config/crd/bases"
    rm -rf "$GIE_CRDS.tmp"
    mkdir -p "$GIE_CRDS.tmp"
    cp "$src"/*.yaml "$GIE_CRDS.tmp/"
    chmod u+w "$GIE_CRDS.tmp"/*.yaml
    rm -rf "$GIE_CRDS"
    mv "$GIE_CRDS.tmp" "$GIE_CRDS"
    echo "$gie_crds_want" >"$STAMPS/gie-crds"
    echo "cluster-bin: the Gateway API Inference Extension's CRDs copied into $GIE_CRDS"
fi
if [[ ${#stale[@]} -eq 0 ]]; then
    exit 0
fi

echo "cluster-bin: building ${#stale[@]} of ${#TARGETS[@]} binaries into $BIN ($GO_VERSION)."
echo "cluster-bin: a cold build takes a long time on 2 cores (roughly 45-60 minutes)."
total_start=$SECONDS
i=0
for s in "${stale[@]}"; do
    IFS='|' read -r name mod pkg want ld <<<"$s"
    i=$((i + 1))
    start=$SECONDS
    echo "cluster-bin: [$i/${#stale[@]}] $name ($pkg) ..."
    (
        cd "$TOOLS/$mod"
        # CGO off: static binaries, no C toolchain needed.
        CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="-s -w $ld" -o "$BIN/.$name.tmp" "$pkg"
    )
    mv -f "$BIN/.$name.tmp" "$BIN/$name"
    echo "$want" >"$STAMPS/$name"
    echo "cluster-bin: [$i/${#stale[@]}] $name built in $((SECONDS - start))s"
done
echo "cluster-bin: done in $((SECONDS - total_start))s"
