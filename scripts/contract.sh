#!/usr/bin/env bash
# The API contract, fuzzed (issue 18 item 1): starts a node on embedded defaults in a temporary
# data dir, then runs Schemathesis (PyPI, pinned, in <repo>/.venv-contract) against its
# `GET /v1/openapi.json`, twice: every operation on the empty node, then every operation but
# the deletes with a KB, a document and a session made first and their ids given as path
# parameters. Each answer is checked for no 5xx and for the status, media type and body (each
# event of a stream) the document gives it (the error body on every failure). Exits non-zero
# with Schemathesis's report when a check fails.
# Usage: scripts/contract.sh [SIFT_BIN] [MAX_EXAMPLES]   (defaults: target/debug/sift, 20)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$repo/target/debug/sift}
examples=${2:-20}
venv=$repo/.venv-contract
if [[ ! -x $bin ]]; then
  (cd "$repo" && cargo build -p sift-node --bin sift)
fi
requirements="schemathesis==4.32.5"
if [[ ! -x $venv/bin/schemathesis ]] || [[ $(cat "$venv/.requirements" 2>/dev/null) != "$requirements" ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $requirements
  echo "$requirements" > "$venv/.requirements"
fi
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$("$repo/scripts/fetch-model.sh")}
work=$(mktemp -d)
read -r key port < <(python3 -c '
import secrets, socket
s = socket.socket(); s.bind(("127.0.0.1", 0))
print(f"sk-sift-{secrets.token_hex(6)}-{secrets.token_hex(24)}", s.getsockname()[1])')
# url_fetch_loopback_only: generated URLs never reach past this machine (no DNS, loopback only)
SIFT_ADMIN_KEY=$key SIFT_URL_FETCH_LOOPBACK_ONLY=true "$bin" serve --data-dir "$work/data" --listen "127.0.0.1:$port" \
  > "$work/node.log" 2>&1 &
node=$!
# (`|| true`: under set -e, `wait` on the killed node fails and would end the trap before the rm)
trap 'kill $node 2>/dev/null || true; wait $node 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 600); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/readyz', timeout=1)" \
    2>/dev/null && break
  kill -0 $node 2>/dev/null || { cat "$work/node.log" >&2; exit 1; }
  sleep 0.2
done
checks=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance
# Every operation on an empty node (ids it never made: mostly 404).
"$venv/bin/schemathesis" run "http://127.0.0.1:$port/v1/openapi.json" \
  --header "Authorization: Bearer $key" --checks "$checks" \
  --max-examples "$examples" --seed 1 --no-color
# Then with a KB, a document and a session to act on, their ids given as the path parameters
# (deletes left out, so that they stay for the whole run).
python3 - "$port" "$key" "$work/schemathesis.toml" <<'PY'
import json, sys, urllib.request
port, key, config = sys.argv[1:4]
def post(path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)
post("/v1/kbs", {"name": "contract"})
doc = post("/v1/kbs/contract/documents", {"documents": [
    {"title": "Lights", "text": "Lighthouses guide ships along the coast at night."}]})
session = post("/v1/sessions", {"kbs": ["contract"]})
with open(config, "w") as f:
    f.write('[parameters]\n"path.kb" = "contract"\n'
            f'"path.doc" = "{doc["documents"][0]["id"]}"\n"path.id" = "{session["id"]}"\n')
PY
"$venv/bin/schemathesis" --config-file "$work/schemathesis.toml" \
  run "http://127.0.0.1:$port/v1/openapi.json" \
  --header "Authorization: Bearer $key" --checks "$checks" --exclude-method DELETE \
  --max-examples "$examples" --seed 1 --no-color
