#!/usr/bin/env bash
# A/B of two builds of the node, alternating in one sitting: ingestion of a SciFact slice
# with its vectors already cached (the write path alone), then search latency over HTTP
# with the KB's default pipeline. Every measurement starts its node on a fresh copy of one
# template data dir.
#
#   scripts/ab-bench.sh BIN_A BIN_B [ROUNDS] [DOCS]
#
# BIN_A and BIN_B are `sift` binaries; sift-bench is ./target/debug/sift-bench (or
# $SIFT_BENCH). The data is $SIFT_SCIFACT_DIR (default ../shared/data/scifact).
set -euo pipefail
cd "$(dirname "$0")/.."
bin_a=$1
bin_b=$2
rounds=${3:-2}
docs=${4:-2000}
bench=${SIFT_BENCH:-./target/debug/sift-bench}
data=${SIFT_SCIFACT_DIR:-../shared/data/scifact}
port=7781
work=$(mktemp -d)
# One admin key for every node (a build without keys ignores it), sent by sift-bench.
SIFT_ADMIN_KEY=${SIFT_ADMIN_KEY:-sk-sift-$(python3 -c 'import secrets; print(secrets.token_hex(6) + "-" + secrets.token_hex(24))')}
export SIFT_ADMIN_KEY
export SIFT_API_KEY=$SIFT_ADMIN_KEY
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "$1/readyz" > /dev/null && return 0
    sleep 0.2
  done
  return 1
}

# The vectors are embedded once, by build A, into a template data dir: every measurement
# starts from a copy of it, so its ingestion finds every vector in the node's cache.
# SIFT_AB_TEMPLATE keeps the template for another run (made when absent).
template=${SIFT_AB_TEMPLATE:-$work/template}
if [ ! -d "$template" ]; then
  "$bin_a" serve --data-dir "$template" --listen "127.0.0.1:$port" > "$work/template.log" 2>&1 &
  template_pid=$!
  wait_ready "http://127.0.0.1:$port"
  "$bench" quality --dataset "$data" --node "http://127.0.0.1:$port" --kb warm --max-docs "$docs" \
    --max-queries 1 --no-hnsw-recall --configs bm25 > /dev/null 2>&1
  kill "$template_pid"
  wait "$template_pid" 2>/dev/null || true
  port=$((port + 1))
fi

measure() {
  local label=$1 bin=$2 round=$3
  local dir="$work/$label-$round" node="http://127.0.0.1:$port"
  cp -r "$template" "$dir"
  "$bin" serve --data-dir "$dir" --listen "127.0.0.1:$port" > "$work/$label-$round.log" 2>&1 &
  local pid=$!
  wait_ready "$node"
  local ingest
  ingest=$("$bench" quality --dataset "$data" --node "$node" --kb cached --max-docs "$docs" \
    --max-queries 1 --no-hnsw-recall --configs bm25 2>/dev/null | grep -i "ingest" | head -1)
  local search
  search=$("$bench" load --node "$node" --kb cached --queries "$data/queries.jsonl" \
    --concurrency 1 --duration 10 --top-k 10 2>&1 | grep -A1 -E "p50 ms" | tr -s ' \n' ' ')
  echo "$label round $round | $ingest | $search"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  port=$((port + 1))
}

for round in $(seq 1 "$rounds"); do
  measure A "$bin_a" "$round"
  measure B "$bin_b" "$round"
done
