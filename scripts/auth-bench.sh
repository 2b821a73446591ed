#!/usr/bin/env bash
# The cost of auth and of document-level access on search, A/B in one sitting (issue 16):
# search latency over HTTP with the KB's default pipeline, one node on a fresh copy of one
# template data dir per measurement, alternating three callers:
#   off:    auth = "off" (no key checked)
#   admin:  auth on, the admin key (tenant and key checks, no group filter)
#   groups: auth on, a reader key with groups (the group filter inside every shard)
#
#   scripts/auth-bench.sh [BIN] [ROUNDS] [DOCS] [RESTRICTED]
#
# With RESTRICTED > 0 the KB also holds RESTRICTED more abstracts readable only by group
# `team-a` (which the reader key has) and RESTRICTED only by `team-z` (which it lacks), so that
# the group filter has something to hide; with 0 (the default) every document is open.
#
# BIN is a `sift` binary (default ./target/debug/sift); sift-bench is ./target/debug/sift-bench
# (or $SIFT_BENCH). The data is $SIFT_SCIFACT_DIR (default ../shared/data/scifact).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-./target/debug/sift}
rounds=${2:-2}
docs=${3:-2000}
restricted=${4:-0}
bench=${SIFT_BENCH:-./target/debug/sift-bench}
data=${SIFT_SCIFACT_DIR:-../shared/data/scifact}
port=7791
work=$(mktemp -d)
admin=sk-sift-$(python3 -c 'import secrets; print(secrets.token_hex(6) + "-" + secrets.token_hex(24))')
export SIFT_ADMIN_KEY=$admin
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "$1/readyz" > /dev/null && return 0
    sleep 0.2
  done
  return 1
}

# The template: DOCS SciFact abstracts ingested once (embedded once).
"$bin" serve --data-dir "$work/template" --listen "127.0.0.1:$port" > "$work/template.log" 2>&1 &
pid=$!
wait_ready "http://127.0.0.1:$port"
SIFT_API_KEY=$admin "$bench" quality --dataset "$data" --node "http://127.0.0.1:$port" --kb bench \
  --max-docs "$docs" --max-queries 1 --no-hnsw-recall --configs bm25 > /dev/null 2>&1
if [ "$restricted" -gt 0 ]; then
  python3 - "$data/corpus.jsonl" "$docs" "$restricted" > "$work/restricted.json" <<'PY'
import json, sys
path, skip, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = open(path).read().splitlines()[skip:skip + 2 * count]
documents = []
for n, line in enumerate(lines):
    record = json.loads(line)
    group = "team-a" if n < count else "team-z"
    documents.append({"external_id": "restricted-" + record["_id"], "title": record.get("title", ""),
                      "text": record["text"], "access": {"groups": [group]}})
print(json.dumps({"documents": documents}))
PY
  curl -sf -H "authorization: Bearer $admin" -H 'content-type: application/json' \
    --data-binary @"$work/restricted.json" "http://127.0.0.1:$port/v1/kbs/bench/documents" > /dev/null
  want=$((docs + 2 * restricted))
  for _ in $(seq 1 1200); do
    ready=$(curl -sf -H "authorization: Bearer $admin" "http://127.0.0.1:$port/v1/kbs/bench" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["documents"].get("ready", 0))')
    [ "$ready" -ge "$want" ] && break
    sleep 0.5
  done
fi
kill "$pid"; wait "$pid" 2>/dev/null || true
port=$((port + 1))

measure() {
  local mode=$1 round=$2
  local dir="$work/$mode-$round" node="http://127.0.0.1:$port" key=$admin auth=on
  cp -r "$work/template" "$dir"
  [ "$mode" = off ] && auth=off
  SIFT_AUTH=$auth "$bin" serve --data-dir "$dir" --listen "127.0.0.1:$port" > "$dir.log" 2>&1 &
  local pid=$!
  wait_ready "$node"
  if [ "$mode" = groups ]; then
    key=$(curl -sf -H "authorization: Bearer $admin" -H 'content-type: application/json' \
      -d '{"name":"bench reader","role":"reader","groups":["team-a","team-b"]}' \
      "$node/v1/keys" | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
  fi
  local search
  search=$(SIFT_API_KEY=$key "$bench" load --node "$node" --kb bench --queries "$data/queries.jsonl" \
    --concurrency 1 --duration 10 --top-k 10 2>&1 | grep -A1 -E "p50 ms" | tr -s ' \n' ' ')
  echo "$mode round $round | $search"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  port=$((port + 1))
}

for round in $(seq 1 "$rounds"); do
  for mode in off admin groups; do
    measure "$mode" "$round"
  done
done
