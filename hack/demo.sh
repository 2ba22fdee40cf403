#!/usr/bin/env bash
# `make demo`: the main job. Arguments go to the live part (`make demo ARGS="--minutes 9"`;
# `python -m prescaler_demo --help` with PYTHONPATH=hack/demo:tests lists them).
#
# 1. Offline, at once: the brief's worked example, the KV-cache limit of Llama-3.1-70B and a
#    backtest of an hour of Azure traffic (HPA vs prescaler vs oracle). Meanwhile the local
#    cluster's binaries build in the background (slow the first time, cached afterwards).
# 2-8. Live (hack/demo/prescaler_demo): a local cluster with kwok GPU nodes and a real
#    Prometheus, a week of a real trace as vLLM history, a GPU Deployment with a cold start,
#    an annotated InferencePool with a scheduled window and standby, the operator, and a
#    simulated vLLM fleet playing the next minutes of the trace; a live timeline, a PNG of
#    demand against ready capacity (prescaler live, the HPA on the same demand), clean-up.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${DEMO_OUT:-out/demo}
TRACES=${PRESCALER_TRACES:-../shared/traces}
mkdir -p "$OUT/offline"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

BUILD_PID=""
stop_build() {
    if [[ -n $BUILD_PID ]] && kill -0 "$BUILD_PID" 2>/dev/null; then
        kill -- "-$BUILD_PID" 2>/dev/null || true
    fi
}
trap stop_build EXIT

# The binaries the demo runs (not helm nor KEDA, which only the tests use) build in their
# own process group (stopped on exit) while step 1 runs.
DEMO_BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl kubectl)
setsid bash hack/cluster/build.sh "${DEMO_BINARIES[@]}" >"$OUT/build.log" 2>&1 &
BUILD_PID=$!

say "1. Offline, while the local cluster's binaries build (log: $OUT/build.log)"
say "1a. The worked example: 500 users in a 15-minute window, 1000 prompt + 500 output tokens"
$BIN/prescaler plan --concurrent-users 500 --prompt-tokens 1000 --output-tokens 500 \
    --window-minutes 15 --fleet-tokens-per-second 20000

say "1b. KV-cache memory caps concurrency: Llama-3.1-70B on 4 x 80 GiB at 4k context"
$BIN/prescaler plan --model llama-3.1-70b --gpu-memory-gib 80 --gpus-per-replica 4 \
    --context-tokens 4096

trace="$TRACES/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
say "1c. Backtest: one hour of Azure code-completion traffic played at 10x, 240 s cold start"
echo "   reactive = Kubernetes HPA v2 at 70 % utilization; oracle = perfect foresight."
echo "   predictive = the operator's forecaster and planner, at an InferencePool's defaults."
$BIN/prescaler backtest --trace "$trace" --format azure --time-scale 10 \
    --trace-step-seconds 600 --cold-start-seconds 240 \
    --policies reactive,predictive,oracle --scale-to-peak-replicas 40 \
    --replica-tokens-per-second 20000 --json "$OUT/offline/backtest.json" \
    --timeline "$OUT/offline/timeline.csv" --plot "$OUT/offline/backtest.png" --quiet
$BIN/python - "$OUT/offline/backtest.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
print(f"{'policy':<12}{'shortfall min':>15}{'unserved tokens':>17}{'GPU-hours':>11}{'scale events':>14}")
for name, p in result["policies"].items():
    print(f"{name:<12}{p['shortfall_minutes']:>15}{p['unserved_token_fraction']:>17.3f}"
          f"{p['gpu_hours']:>11.1f}{p['scale_events']:>14}")
PY
echo "   plots: $OUT/offline/backtest.png, backtest-zoom.png, backtest-bars.png"

say "1d. Local cluster binaries (cached after the first build)"
shown=0
while kill -0 "$BUILD_PID" 2>/dev/null; do
    total=$(wc -l <"$OUT/build.log")
    if ((total > shown)); then
        sed -n "$((shown + 1)),${total}p" "$OUT/build.log"
        shown=$total
    fi
    sleep 5
done
if ! wait "$BUILD_PID"; then
    tail -n +"$((shown + 1))" "$OUT/build.log"
    echo "demo: building the cluster binaries failed (log: $OUT/build.log)" >&2
    exit 1
fi
BUILD_PID=""
tail -n +"$((shown + 1))" "$OUT/build.log"
bash hack/cluster/install-prometheus.sh

PYTHONPATH="hack/demo:tests${PYTHONPATH:+:$PYTHONPATH}" \
    $BIN/python -m prescaler_demo --out "$OUT" "$@"
