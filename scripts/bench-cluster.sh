#!/usr/bin/env bash
# One node against three (separate processes on loopback): the same SciFact documents and
# queries on both, then
#   - whether the fused top 10 of every query is the same (by external id),
#   - search latency p50/p99 at concurrency 1 and QPS at concurrency 16 (sift-bench load),
#   - CPU seconds each node spent during the load,
#   - ingestion wall time (sift-bench quality loads the KB; it also prints nDCG@10).
# Usage: scripts/bench-cluster.sh DATASET_DIR [MAX_DOCS] [BIN_DIR]
#   DATASET_DIR  a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv), e.g. ../shared/data/scifact
#   MAX_DOCS     documents to load (default 1000; the judged ones of the first queries first)
#   BIN_DIR      where sift and sift-bench are (default target/release if built, else target/debug)
# Output: a summary on stdout and JSON files in $OUT (default /tmp/sift-bench-cluster).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dataset=$(cd "${1:?usage: scripts/bench-cluster.sh DATASET_DIR [MAX_DOCS] [BIN_DIR]}" && pwd)
max_docs=${2:-1000}
source "$repo/scripts/bench-lib.sh"
bin=$(pick_bin "${3:-}")
out=${OUT:-/tmp/sift-bench-cluster}
rm -rf "$out" && mkdir -p "$out"
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$("$repo/scripts/fetch-model.sh")}
export SIFT_CLUSTER_SECRET=bench-cluster-secret
duration=${DURATION:-20}

start() { # name listen [internal] [join]
  local name=$1 listen=$2
  local args=(serve --data-dir "$out/$name" --listen "$listen")
  [ -n "${3:-}" ] && args+=(--internal-listen "$3")
  [ -n "${4:-}" ] && args+=(--join "$4")
  SIFT_LOG=warn "$bin/sift" "${args[@]}" >"$out/$name.out" 2>"$out/$name.log" &
  pids+=($!)
  echo $! >"$out/$name.pid"
  for _ in $(seq 1 600); do
    curl -sf "http://$listen/readyz" >/dev/null && return 0
    sleep 0.2
  done
  echo "node $name did not start; log:" >&2; tail -20 "$out/$name.log" >&2; exit 1
}

echo "binaries: $bin; documents: $max_docs; results in $out"
start single 127.0.0.1:7710
start c1 127.0.0.1:7720 127.0.0.1:7820
start c2 127.0.0.1:7721 127.0.0.1:7821 127.0.0.1:7720
start c3 127.0.0.1:7722 127.0.0.1:7822 127.0.0.1:7720
for _ in $(seq 1 300); do
  voters=$(api http://127.0.0.1:7720/v1/cluster | python3 -c 'import json,sys; v=json.load(sys.stdin); print(sum(1 for n in v["nodes"] if n["role"] in ("leader","follower")))')
  [ "$voters" = 3 ] && break
  sleep 0.5
done

# 3 shards; on the cluster with replication factor $REPLICATION (default 1: each shard on its
# own node, so a search on one node asks two leaves on the others over the internal port).
replication=${REPLICATION:-1}
for target in single:7710:1 cluster:7720:$replication; do
  IFS=: read -r name port factor <<<"$target"
  api -X POST "http://127.0.0.1:$port/v1/kbs" -H 'content-type: application/json' \
    -d "{\"name\": \"scifact\", \"shards\": 3, \"replication_factor\": $factor}" >/dev/null
  /usr/bin/time -f "%e" -o "$out/$name.ingest_seconds" \
    "$bin/sift-bench" quality --dataset "$dataset" --node "http://127.0.0.1:$port" \
      --kb scifact --max-docs "$max_docs" --reuse --no-hnsw-recall \
      --configs fused --json "$out/$name.quality.json" >"$out/$name.quality.txt"
done

# The same queries on both: fused top 10 by external id.
python3 - "$dataset/queries.jsonl" "$out" <<'PY'
import json, sys, urllib.request
queries = [json.loads(l)["text"] for l in open(sys.argv[1])][:200]
def top(port, q):
    body = json.dumps({"query": q, "top_k": 10}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/kbs/scifact/search", body,
                                 {"content-type": "application/json"})
    a = json.load(urllib.request.urlopen(req))
    assert not a.get("failed_shards"), a["failed_shards"]
    return [h.get("external_id") for h in a["hits"]]
same = across = 0
for q in queries:
    single, cluster = top(7710, q), [top(port, q) for port in (7720, 7721, 7722)]
    same += sum(single == c for c in cluster)
    across += cluster[0] == cluster[1] == cluster[2]
print(f"identical fused top 10, 1 node vs each cluster node: {same} of {3 * len(queries)}")
print(f"identical fused top 10 on the 3 cluster nodes: {across} of {len(queries)}")
with open(f"{sys.argv[2]}/queries.txt", "w") as f:
    f.write("\n".join(queries) + "\n")
PY

for target in single:7710 cluster:7720; do
  name=${target%%:*} port=${target##*:}
  for concurrency in 1 16; do
    before=()
    for p in "${pids[@]}"; do before+=("$(cpu_seconds "$p")"); done
    "$bin/sift-bench" load --kb scifact --queries "$out/queries.txt" \
      --node "http://127.0.0.1:$port" --concurrency "$concurrency" --duration "$duration" \
      --json "$out/$name.c$concurrency.json" >"$out/$name.c$concurrency.txt"
    line="$name c=$concurrency cpu seconds per node:"
    i=0
    for p in "${pids[@]}"; do
      line+=" $(python3 -c "print(round($(cpu_seconds "$p") - ${before[$i]}, 1))")"
      i=$((i + 1))
    done
    echo "$line (single c1 c2 c3)"
    grep -v "^load:" "$out/$name.c$concurrency.txt" | sed "s/^/  /"
  done
  echo "$name ingestion (load + quality run): $(cat "$out/$name.ingest_seconds") s"
  grep -iE "fused" "$out/$name.quality.txt" | head -2 | sed "s/^/  /"
done
