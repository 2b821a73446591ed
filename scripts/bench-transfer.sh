#!/usr/bin/env bash
# Shard transfer: how long a fourth node takes to receive its replicas (join rebalancing), and
# a node takes to drain (each replica re-created elsewhere, then the node removed). Three
# nodes on loopback load a KB (embeddings from scripts/embed-server.py, so ingestion is cheap),
# then node 4 joins, then node 1 is removed through `DELETE /v1/cluster/nodes/1`.
# Usage: scripts/bench-transfer.sh DATASET_DIR [MAX_DOCS] [BIN_DIR]
#   SHARDS (default 12), REPLICATION (default 1)
# Output: per phase, wall seconds until the placement settled, replicas filled, documents and
# bytes copied (from the nodes' sift_replica_* metrics), and the copy rate.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dataset=$(cd "${1:?usage: scripts/bench-transfer.sh DATASET_DIR [MAX_DOCS] [BIN_DIR]}" && pwd)
max_docs=${2:-5183}
source "$repo/scripts/bench-lib.sh"
bin=$(pick_bin "${3:-}")
out=${OUT:-/tmp/sift-bench-transfer}
rm -rf "$out" && mkdir -p "$out"
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$("$repo/scripts/fetch-model.sh")}
export SIFT_CLUSTER_SECRET=bench-transfer-secret
export SIFT_REPAIR_INTERVAL_MS=${SIFT_REPAIR_INTERVAL_MS:-1000}
shards=${SHARDS:-12}
replication=${REPLICATION:-1}

python3 "$repo/scripts/embed-server.py" --listen 127.0.0.1:7791 &
pids+=($!)
cat >"$out/sift.toml" <<TOML
[embedding.remote.ext]
base_url = "http://127.0.0.1:7791/v1"
model = "hash-384"
dimension = 384
TOML
sleep 1

start_node() { # index
  local i=$1 listen=127.0.0.1:$((7740 + $1)) internal=127.0.0.1:$((7840 + $1))
  local args=(serve --config "$out/sift.toml" --data-dir "$out/node$i" --listen "$listen"
    --internal-listen "$internal")
  [ "$i" -gt 1 ] && args+=(--join 127.0.0.1:7741)
  SIFT_LOG=warn,sift_actors::node=info "$bin/sift" "${args[@]}" >"$out/node$i.out" 2>"$out/node$i.log" &
  pids+=($!)
  for _ in $(seq 1 600); do
    curl -sf "http://$listen/readyz" >/dev/null && break
    sleep 0.2
  done
}

# Placement summary: "settled replicas-per-node" (settled = every shard at its factor, all active).
placement() {
  api http://127.0.0.1:7742/v1/kbs/transfer/shards | python3 -c '
import json, sys
from collections import Counter
v = json.load(sys.stdin)
per_node, settled = Counter(), True
for shard in v["shards"]:
    replicas = shard["replicas"]
    settled &= len(replicas) == '"$replication"' and all(r["state"] == "active" for r in replicas)
    per_node.update(r["node"] for r in replicas)
print("settled" if settled else "moving", dict(sorted(per_node.items())))'
}

# Sum of a counter over the nodes still up.
metric_sum() { # name
  local total=0
  for port in 7741 7742 7743 7744; do
    value=$(api "http://127.0.0.1:$port/metrics" 2>/dev/null | awk -v m="$1" '$1 == m { print $2 }' | head -1)
    total=$(python3 -c "print($total + ${value:-0})")
  done
  echo "$total"
}

wait_settled() { # condition (python expression over per_node, a dict node -> replicas)
  local started
  started=$(date +%s.%N)
  for _ in $(seq 1 6000); do
    line=$(placement || true)
    if [[ $line == settled* ]] && python3 -c "per_node = ${line#settled }; import sys; sys.exit(0 if ($1) else 1)"; then
      break
    fi
    sleep 0.1
  done
  python3 -c "print(round($(date +%s.%N) - $started, 1))"
}

for i in 1 2 3; do start_node "$i"; done
for _ in $(seq 1 300); do
  voters=$(api http://127.0.0.1:7741/v1/cluster | python3 -c 'import json,sys; v=json.load(sys.stdin); print(sum(1 for n in v["nodes"] if n["role"] in ("leader","follower")))')
  [ "$voters" = 3 ] && break
  sleep 0.5
done
api -X POST http://127.0.0.1:7741/v1/kbs -H 'content-type: application/json' \
  -d "{\"name\": \"transfer\", \"shards\": $shards, \"replication_factor\": $replication, \"embedding_model\": \"ext\"}" >/dev/null
"$bin/sift-bench" quality --dataset "$dataset" --node http://127.0.0.1:7741 --kb transfer \
  --max-docs "$max_docs" --max-queries 1 --reuse --no-hnsw-recall --configs bm25 >"$out/load.txt"
echo "binaries: $bin; $max_docs documents, $shards shards, replication $replication: $(placement)"

copied_before=0
bytes_before=0
fills_before=0
report() { # phase seconds: this phase's fills, documents and bytes copied (metric deltas)
  local copied bytes fills
  copied=$(metric_sum sift_replica_copied_documents_total)
  bytes=$(metric_sum sift_replica_transfer_bytes_total)
  fills=$(metric_sum sift_replica_repair_seconds_count)
  echo "$1: ${2}s until settled ($(placement)); fills $(python3 -c "print(int($fills - $fills_before))")," \
    "documents copied $(python3 -c "print(int($copied - $copied_before))")," \
    "bytes $(python3 -c "print(int($bytes - $bytes_before))")," \
    "$(python3 -c "print(round(($copied - $copied_before) / max($2, 0.1)))") docs/s"
  copied_before=$copied bytes_before=$bytes fills_before=$fills
}

start_node 4
seconds=$(wait_settled 'per_node.get(4, 0) >= 1 and max(per_node.values()) - min(per_node.values()) <= 1')
report "join of node 4" "$seconds"

api -X DELETE http://127.0.0.1:7742/v1/cluster/nodes/1 >/dev/null
seconds=$(wait_settled '1 not in per_node')
report "drain of node 1" "$seconds"
