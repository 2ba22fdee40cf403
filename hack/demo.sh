#!/usr/bin/env bash
# `make demo`: the main job, on this machine, with no cluster needed.
#
# Until the operator demo (a local cluster with fake GPU nodes, a real Prometheus and a
# live InferencePool) lands, this runs the capacity plan for the brief's worked example,
# the KV-cache memory limit of Llama-3.1-70B, and a backtest of one hour of real Azure code
# completion traffic (played at 10x) through a simulated GPU fleet: the HPA vs prescaler vs
# the oracle.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${DEMO_OUT:-out/demo}
TRACES=${PRESCALER_TRACES:-../shared/traces}
mkdir -p "$OUT"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "Demo (interim): capacity planning and a trace backtest; the live-cluster demo comes later."

say "1. The worked example: 500 users in a 15-minute window, 1000 prompt + 500 output tokens"
$BIN/prescaler plan --concurrent-users 500 --prompt-tokens 1000 --output-tokens 500 \
    --window-minutes 15 --fleet-tokens-per-second 20000

say "2. KV-cache memory caps concurrency: Llama-3.1-70B on 4 x 80 GiB at 4k context"
$BIN/prescaler plan --model llama-3.1-70b --gpu-memory-gib 80 --gpus-per-replica 4 \
    --context-tokens 4096

say "3. Replicas for 12 req/s of that mix at a measured 2,500 tokens/s per replica"
$BIN/prescaler plan --model llama-3.1-70b --gpu-memory-gib 80 --gpus-per-replica 4 \
    --prompt-tokens 1000 --output-tokens 500 --context-tokens 4096 \
    --replica-tokens-per-second 2500 --requests-per-second 12

trace="$TRACES/azure_llm_2023/AzureLLMInferenceTrace_code.csv"
say "4. Backtest: one hour of Azure code-completion traffic played at 10x, 240 s cold start"
echo "   reactive = Kubernetes HPA v2 at 70 % utilization; oracle = perfect foresight."
echo "   predictive = the operator's forecaster and planner, at an InferencePool's defaults."
$BIN/prescaler backtest --trace "$trace" --format azure --time-scale 10 \
    --trace-step-seconds 600 --cold-start-seconds 240 \
    --policies reactive,predictive,oracle --scale-to-peak-replicas 40 \
    --replica-tokens-per-second 20000 \
    --json "$OUT/backtest.json" --timeline "$OUT/timeline.csv" --plot "$OUT/backtest.png" --quiet
$BIN/python - "$OUT/backtest.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
print(f"{'policy':<12}{'shortfall min':>15}{'unserved tokens':>17}{'GPU-hours':>11}{'scale events':>14}")
for name, p in result["policies"].items():
    print(f"{name:<12}{p['shortfall_minutes']:>15}{p['unserved_token_fraction']:>17.3f}"
          f"{p['gpu_hours']:>11.1f}{p['scale_events']:>14}")
PY
say "Plots: $OUT/backtest.png (demand vs ready capacity), $OUT/backtest-zoom.png, $OUT/backtest-bars.png"
