#!/usr/bin/env bash
# Makes tests/fixtures/data-dir/v<N>.tar.gz: a data directory of this build's format (N is
# sift_storage::data_dir::FORMAT_VERSION) that tests/tests/upgrade.rs opens with every later
# build. Run it once when the format version is raised, and commit the new archive beside the
# old ones (each stays: every later build must open every one of them).
#
#   scripts/make-data-dir-fixture.sh [BIN]
#
# BIN is a `sift` binary (default ./target/debug/sift). Its content: the KB "papers" (2 shards)
# with the first 6 documents of tests/fixtures/scifact-slice, one of them deleted; the tenant
# "acme" with its KB "notes" holding one document readable by the group "finance" only.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-./target/debug/sift}
version=$(sed -n 's/^pub const FORMAT_VERSION: u32 = \([0-9]*\);/\1/p' storage/src/data_dir.rs)
out=tests/fixtures/data-dir/v$version.tar.gz
work=$(mktemp -d)
port=7792
url=http://127.0.0.1:$port
# The tests' admin key (sift_node::config::TEST_ADMIN_KEY): the tests open it with that key.
admin=$(sed -n '/^pub const TEST_ADMIN_KEY/,/;/p' node/src/config.rs | grep -o '"sk-sift-[^"]*"' | tr -d '"')
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
SIFT_ADMIN_KEY=$admin "$bin" serve --data-dir "$work/data" --listen "127.0.0.1:$port" > "$work/log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do curl -sf "$url/readyz" > /dev/null && break; sleep 0.2; done
call() { curl -sf -H "authorization: Bearer $1" -H 'content-type: application/json' -X "$2" "$url$3" ${4:+-d "$4"}; }
call "$admin" POST /v1/kbs '{"name":"papers","shards":2}' > /dev/null
docs=$(head -6 tests/fixtures/scifact-slice/corpus.jsonl | python3 -c '
import json, sys
print(json.dumps({"documents": [
    {"external_id": d["_id"], "title": d["title"], "text": d["text"]}
    for d in map(json.loads, sys.stdin)]}))')
ids=$(call "$admin" POST /v1/kbs/papers/documents "$docs" | python3 -c '
import json, sys; print(" ".join(d["id"] for d in json.load(sys.stdin)["documents"]))')
call "$admin" POST /v1/tenants '{"name":"acme"}' > /dev/null
acme=$(call "$admin" POST /v1/keys '{"name":"acme editor","role":"editor","tenant":"acme","groups":["finance"]}' |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])')
call "$acme" POST /v1/kbs '{"name":"notes"}' > /dev/null
call "$acme" POST /v1/kbs/notes/documents \
  '{"documents":[{"external_id":"memo","text":"The quarterly budget memo names the heron fund.","access":{"groups":["finance"]}}]}' > /dev/null
ready() {
  call "$1" GET "/v1/kbs/$2" | python3 -c "
import json, sys; c = json.load(sys.stdin)['documents']; sys.exit(0 if c.get('ready', 0) == $3 else 1)"
}
for _ in $(seq 1 600); do ready "$admin" papers 6 && ready "$acme" notes 1 && break; sleep 0.5; done
ready "$admin" papers 6 && ready "$acme" notes 1
call "$admin" DELETE "/v1/kbs/papers/documents/${ids##* }" > /dev/null
kill -TERM "$pid"; wait "$pid" || true
rm -rf "$work/data/tmp" "$work/data/admin.key"
mkdir -p "$(dirname "$out")"
tar -C "$work/data" --sort=name --owner=0 --group=0 --numeric-owner -czf "$out" .
echo "wrote $out ($(du -h "$out" | cut -f1)); the deleted document: ${ids##* }"
