#!/usr/bin/env bash
# What one shard replica costs a node (issue 14, item 2): threads, open file descriptors and
# resident memory of one `sift serve` process, before and after KBS knowledge bases of SHARDS
# shards each are created, and again after one document was written into every KB and the
# node sat idle for IDLE seconds. Prints the totals and the cost per shard.
#
#   scripts/shard-cost.sh [BIN] [KBS] [SHARDS] [IDLE]
#
# BIN is a `sift` binary (default ./target/debug/sift). The node runs with auth off on
# 127.0.0.1 and a fresh data dir; traffic goes to loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-./target/debug/sift}
kbs=${2:-8}
shards=${3:-16}
idle=${4:-70}
port=7797
node="http://127.0.0.1:$port"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

SIFT_AUTH=off SIFT_MAX_SHARDS_PER_NODE=100000 "$bin" serve --data-dir "$work/data" \
  --listen "127.0.0.1:$port" > "$work/node.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  curl -sf "$node/readyz" > /dev/null && break
  sleep 0.2
done

measure() {
  local threads fds rss
  threads=$(ls "/proc/$pid/task" | wc -l)
  fds=$(ls "/proc/$pid/fd" | wc -l)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
  echo "$threads $fds $rss"
}

per_shard() {
  local label=$1 before=$2 after=$3 count=$4
  python3 - "$label" "$before" "$after" "$count" <<'PY'
import sys
label, before, after, count = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
b = [int(x) for x in before]; a = [int(x) for x in after]
print(f"{label:<28} threads {a[0]:>6} ({(a[0]-b[0])/count:6.2f}/shard)  "
      f"fds {a[1]:>6} ({(a[1]-b[1])/count:6.2f}/shard)  "
      f"rss {a[2]/1024:8.1f} MiB ({(a[2]-b[2])/count:7.1f} KiB/shard)")
PY
}

sleep 2
start=$(measure)
total=$((kbs * shards))
for n in $(seq 1 "$kbs"); do
  curl -sf -X POST "$node/v1/kbs" -H 'content-type: application/json' \
    -d "{\"name\": \"cost$n\", \"shards\": $shards}" > /dev/null
done
sleep 2
created=$(measure)
for n in $(seq 1 "$kbs"); do
  docs=$(python3 -c "import json; print(json.dumps({'documents': [{'text': f'document {i} of kb $n, a few words to index', 'external_id': str(i)} for i in range($shards * 2)]}))")
  curl -sf -X POST "$node/v1/kbs/cost$n/documents" -H 'content-type: application/json' \
    -d "$docs" > /dev/null
done
# Wait until every document is ready.
for _ in $(seq 1 600); do
  pending=0
  for n in $(seq 1 "$kbs"); do
    ready=$(curl -sf "$node/v1/kbs/cost$n" | python3 -c 'import json,sys; print(json.load(sys.stdin)["documents"].get("ready", 0))')
    [ "$ready" -lt $((shards * 2)) ] && pending=1
  done
  [ "$pending" = 0 ] && break
  sleep 0.5
done
written=$(measure)
sleep "$idle"
rested=$(measure)
echo "$kbs KBs x $shards shards = $total shard replicas ($bin)"
per_shard "empty node" "$start" "$start" 1
per_shard "after create" "$start" "$created" "$total"
per_shard "after a write to each" "$start" "$written" "$total"
per_shard "after ${idle}s idle" "$start" "$rested" "$total"
