#!/usr/bin/env bash
# Ingestion throughput with 1, 2 and 3 nodes (separate processes on loopback, cluster mode),
# embeddings from an external server (scripts/embed-server.py: the OpenAI wire format, hash
# vectors, fixed cost) so that embedding cost is held fixed and the pipeline itself is measured.
# The documents are uploaded through node 1 only: since ADR 0011 each shard's replicas ingest
# its documents, so the work spreads over the nodes holding the shards.
# Usage: scripts/bench-ingest.sh DATASET_DIR [MAX_DOCS] [BIN_DIR]
#   SHARDS (default 6), REPLICATION (default 1), NODES (default "1 2 3"), EMBED_DELAY_MS (0)
# Output: one line per node count (docs/s, wall seconds, CPU seconds per node and of the
# embedding server); JSON from sift-bench in $OUT (default /tmp/sift-bench-ingest).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dataset=$(cd "${1:?usage: scripts/bench-ingest.sh DATASET_DIR [MAX_DOCS] [BIN_DIR]}" && pwd)
max_docs=${2:-2000}
source "$repo/scripts/bench-lib.sh"
bin=$(pick_bin "${3:-}")
out=${OUT:-/tmp/sift-bench-ingest}
rm -rf "$out" && mkdir -p "$out"
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$("$repo/scripts/fetch-model.sh")}
export SIFT_CLUSTER_SECRET=bench-ingest-secret
shards=${SHARDS:-6}
replication=${REPLICATION:-1}

python3 "$repo/scripts/embed-server.py" --listen 127.0.0.1:7790 \
  --delay-ms "${EMBED_DELAY_MS:-0}" &
embed_pid=$!
pids+=("$embed_pid")
cat >"$out/sift.toml" <<TOML
[embedding.remote.ext]
base_url = "http://127.0.0.1:7790/v1"
model = "hash-384"
dimension = 384
TOML
sleep 1

echo "binaries: $bin; documents: $max_docs; shards $shards, replication $replication"
for nodes in ${NODES:-1 2 3}; do
  run=$out/n$nodes
  mkdir -p "$run"
  node_pids=()
  for i in $(seq 1 "$nodes"); do
    listen=127.0.0.1:$((7730 + i)) internal=127.0.0.1:$((7830 + i))
    args=(serve --config "$out/sift.toml" --data-dir "$run/node$i" --listen "$listen"
      --internal-listen "$internal")
    [ "$i" -gt 1 ] && args+=(--join 127.0.0.1:7731)
    SIFT_LOG=warn "$bin/sift" "${args[@]}" >"$run/node$i.out" 2>"$run/node$i.log" &
    pids+=($!) node_pids+=($!)
    for _ in $(seq 1 600); do
      curl -sf "http://$listen/readyz" >/dev/null && break
      sleep 0.2
    done
  done
  for _ in $(seq 1 300); do
    voters=$(api http://127.0.0.1:7731/v1/cluster | python3 -c 'import json,sys; v=json.load(sys.stdin); print(sum(1 for n in v["nodes"] if n["role"] in ("leader","follower")))')
    [ "$voters" = "$nodes" ] && break
    sleep 0.5
  done
  factor=$((replication < nodes ? replication : nodes))
  api -X POST http://127.0.0.1:7731/v1/kbs -H 'content-type: application/json' \
    -d "{\"name\": \"ingest\", \"shards\": $shards, \"replication_factor\": $factor, \"embedding_model\": \"ext\"}" >/dev/null
  before=()
  for p in "${node_pids[@]}" "$embed_pid"; do before+=("$(cpu_seconds "$p")"); done
  started=$(date +%s.%N)
  "$bin/sift-bench" quality --dataset "$dataset" --node http://127.0.0.1:7731 --kb ingest \
    --max-docs "$max_docs" --max-queries 1 --reuse --no-hnsw-recall --configs bm25 \
    --json "$run/quality.json" >"$run/quality.txt"
  wall=$(python3 -c "print(round($(date +%s.%N) - $started, 1))")
  cpu=""
  i=0
  for p in "${node_pids[@]}" "$embed_pid"; do
    cpu+=" $(python3 -c "print(round($(cpu_seconds "$p") - ${before[$i]}, 1))")"
    i=$((i + 1))
  done
  rate=$(python3 -c "import json; d=json.load(open('$run/quality.json')); print(next((round(v, 1) for k, v in (d.get('ingest') or d).items() if k == 'docs_per_second'), 'n/a'))" 2>/dev/null || echo n/a)
  echo "$nodes node(s): $rate docs/s; wall ${wall}s (with one query); cpu s per node + embedder:$cpu"
  for p in "${node_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${node_pids[@]}" 2>/dev/null || true
done
