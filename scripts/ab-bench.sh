#!/usr/bin/env bash
# A/B of two builds of the node, alternating in one sitting: ingestion of a SciFact slice
# with its vectors already cached (the write path alone), then search latency over HTTP
# with the KB's default pipeline. Each round starts every build's node on a fresh data dir.
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
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

measure() {
  local label=$1 bin=$2 round=$3
  local dir="$work/$label-$round" node="http://127.0.0.1:$port"
  "$bin" serve --data-dir "$dir" --listen "127.0.0.1:$port" > "$work/$label-$round.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    curl -sf "$node/readyz" > /dev/null && break
    sleep 0.2
  done
  # the first ingestion embeds and fills the node's embedding cache; the second is measured
  "$bench" quality --dataset "$data" --node "$node" --kb warm --max-docs "$docs" \
    --max-queries 1 --no-hnsw-recall --configs bm25 > /dev/null 2>&1
  local ingest
  ingest=$("$bench" quality --dataset "$data" --node "$node" --kb cached --max-docs "$docs" \
    --max-queries 1 --no-hnsw-recall --configs bm25 2>/dev/null | grep -i "ingest" | head -1)
  local search
  search=$("$bench" load --node "$node" --kb cached --queries "$data/queries.jsonl" \
    --concurrency 1 --duration 10 --top-k 10 2>&1 | grep -iE "p50|qps" | tr '\n' ' ')
  echo "$label round $round | $ingest | $search"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  port=$((port + 1))
}

for round in $(seq 1 "$rounds"); do
  measure A "$bin_a" "$round"
  measure B "$bin_b" "$round"
done
