#!/usr/bin/env bash
# Where 8 keep-alive connections opened at once land with 2 worker processes: uvicorn's own --workers (one shared
# listening socket) against `ctxlock serve --workers 2` (a socket per worker, SO_REUSEPORT). Prints each worker
# process's CPU ticks (1/100 s) over five 3-second wrk runs: a 0 means that worker got no connection.
#
#   bash benchmarks/serve_spread.sh ctxlock           # ctxlock serve --workers 2
#   bash benchmarks/serve_spread.sh uvicorn           # uvicorn --factory ... --workers 2 (uvloop when installed)
#   bash benchmarks/serve_spread.sh uvicorn asyncio   # the same with asyncio's event loop
# Needs wrk (`make bench-tools`); run from the repository root with the venv made by `make install-test`.
set -euo pipefail
MODE=${1:-ctxlock}
LOOP=${2:-auto}
PORT=${PORT:-8761}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
printf '[limits]\npool_size = 2\nqueue_depth = 64\n\n[models.nemo]\nspec = "mistral-nemo"\n' >"$TMP/ctxlock.toml"
BODY='{"model":"nemo","messages":[{"role":"user","content":"Why is the sky blue? Ignore [INST] in this text."}]}'
printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = %s\n' "'$BODY'" >"$TMP/post.lua"
if [ "$MODE" = uvicorn ]; then
  CTXLOCK_SERVE_CONFIG=$TMP/ctxlock.toml PYTHONPATH=src .venv/bin/python -m uvicorn --factory \
    ctxlock.server.app:factory --port "$PORT" --workers 2 --log-level warning --loop "$LOOP" >"$TMP/server.log" 2>&1 &
else
  PYTHONPATH=src .venv/bin/python -m ctxlock serve --config "$TMP/ctxlock.toml" --port "$PORT" --workers 2 \
    >"$TMP/server.log" 2>&1 &
fi
P=$!
for _ in $(seq 240); do curl -sf "localhost:$PORT/healthz" >/dev/null && break; sleep 0.5; done
sleep 8  # both workers have loaded the model
declare -A before
for run in 1 2 3 4 5; do
  kids=$(cat /proc/$P/task/*/children)
  for p in $kids; do before[$p]=$(awk '{print $14+$15}' "/proc/$p/stat"); done
  wrk -t1 -c8 -d3s -s "$TMP/post.lua" "http://127.0.0.1:$PORT/tokenize" >/dev/null
  line="$MODE (loop $LOOP) run $run: CPU ticks per worker process:"
  for p in $kids; do
    [ "$(cat /proc/$p/comm)" = python ] || continue
    grep -q "resource_tracker" "/proc/$p/cmdline" && continue
    line="$line $(( $(awk '{print $14+$15}' "/proc/$p/stat") - ${before[$p]} ))"
  done
  echo "$line"
done
kill -TERM $P; wait $P || true
