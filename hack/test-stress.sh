#!/usr/bin/env bash
# `make test-stress`: every cluster test while a CPU burner occupies every core, as on a
# shared CI machine. The burners run at normal priority and stop when this script ends.
#   STRESS_BURNERS=N   burner processes (default: one per core)
#   STRESS_PYTEST="…"  extra pytest arguments for the cluster and Prometheus tests (`make
#                      test-stress` passes the suite's own workers, as `make test` runs them;
#                      without them the tests run one at a time, two to three times longer)
set -euo pipefail
cd "$(dirname "$0")/.."
burners=${STRESS_BURNERS:-$(nproc)}
pids=()
cleanup() { ((${#pids[@]})) && kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
for _ in $(seq "$burners"); do
    .venv/bin/python -c 'while True: pass' &
    pids+=("$!")
done
echo "test-stress: ${burners} CPU burner(s) running (pids ${pids[*]})"
started=$(date +%s)
status=0
# shellcheck disable=SC2086
.venv/bin/pytest -q -m "cluster or prometheus" ${STRESS_PYTEST:-} || status=$?
echo "test-stress: pytest exited ${status} after $(( $(date +%s) - started )) s under ${burners} burner(s)"
exit "$status"
