#!/usr/bin/env bash
# The web console end to end (issue 19): starts a node on embedded defaults in a temporary
# data dir with a fresh admin key, then drives the console in headless Debian chromium with
# playwright-core (pinned in tests/console/package-lock.json, installed with `npm ci`):
# tests/console/e2e.mjs says what it checks.
# The node's chat model is a scripted OpenAI-compatible server (tests/console/fake-llm.mjs).
# Usage: scripts/console-e2e.sh [SIFT_BIN] [--assets-from-disk] [--screenshots]
#   SIFT_BIN            the node binary (default target/debug/sift, built when missing)
#   --assets-from-disk  serve node/console/ from disk on a port of its own (python3, with the
#                       node's content security policy) and let the page call the node across
#                       origins (cors_origins), for a binary built before the console was
#                       compiled in; default: the console the node itself serves at /
#   --screenshots       write a PNG of each page to docs/console/
# Needs node and npm, and chromium with a CJK font (Debian's chromium and fonts-wqy-microhei,
# installed here when missing as root).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/target/debug/sift
from_disk=0
screenshots=
for argument in "$@"; do
  case $argument in
    --assets-from-disk) from_disk=1 ;;
    --screenshots) screenshots=$repo/docs/console ;;
    -*) echo "console-e2e: unknown flag $argument" >&2; exit 2 ;;
    *) bin=$argument ;;
  esac
done
if [[ ! -x $bin ]]; then
  (cd "$repo" && cargo build -p sift-node --bin sift)
fi
# chromium, and a small CJK font (fonts-wqy-microhei) so that the Chinese labels render
if ! command -v chromium >/dev/null || ! fc-list 2>/dev/null | grep -qi wqy; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      chromium fonts-wqy-microhei >/dev/null
  elif ! command -v chromium >/dev/null; then
    echo "console-e2e: chromium is missing: install Debian's chromium package" >&2
    exit 1
  fi
fi
if ! command -v npm >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  else
    echo "console-e2e: node and npm are missing: install Debian's nodejs and npm packages" >&2
    exit 1
  fi
fi
tests=$repo/tests/console
# npm ci again only when the lockfile changed since the last install
if ! cmp -s "$tests/package-lock.json" "$tests/node_modules/.package-lock.json.installed"; then
  (cd "$tests" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$tests/package-lock.json" "$tests/node_modules/.package-lock.json.installed"
fi
# the event-stream parser on its own first (node's test runner)
node --test "$tests/sse.test.mjs"
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$("$repo/scripts/fetch-model.sh")}
work=$(mktemp -d)
read -r key port web_port llm_port < <(python3 -c '
import secrets, socket
a, b, c = socket.socket(), socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0)); c.bind(("127.0.0.1", 0))
print(f"sk-sift-{secrets.token_hex(6)}-{secrets.token_hex(24)}", *(s.getsockname()[1] for s in (a, b, c)))')
pids=()
# every process started here ends with the script (`|| true`: `wait` on a killed child fails,
# which under `set -e` would end the cleanup half way)
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
node_url=http://127.0.0.1:$port
if [[ $from_disk -eq 1 ]]; then
  export SIFT_CORS_ORIGINS=http://127.0.0.1:$web_port
  # python's file server with the node's headers: its content security policy (read from
  # node/src/console.rs) with the node's origin added to connect-src, and no-cache
  python3 - "$web_port" "$repo/node" "$node_url" > "$work/assets.log" 2>&1 <<'PY' &
import functools, http.server, re, sys
port, root, node = sys.argv[1:4]
source = open(f"{root}/src/console.rs").read()
policy = re.search(r'CONTENT_SECURITY_POLICY: &str = "(.*?)";', source, re.S).group(1)
policy = re.sub(r"\\\n\s*", "", policy).replace("connect-src 'self'", f"connect-src 'self' {node}")
class Handler(http.server.SimpleHTTPRequestHandler):
    def end_headers(self):
        self.send_header("Content-Security-Policy", policy)
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), functools.partial(Handler, directory=root))
server.serve_forever()
PY
  pids+=($!)
  console_url=http://127.0.0.1:$web_port/console/index.html
  api_base=$node_url
else
  console_url=$node_url/
  api_base=
fi
# the scripted chat model (tests/console/fake-llm.mjs), 200 ms between its stream's pieces
node "$tests/fake-llm.mjs" "$llm_port" 200 > "$work/llm.log" 2>&1 &
pids+=($!)
cat > "$work/sift.toml" <<TOML
[[llm.providers]]
name = "fake"
kind = "openai"
base_url = "http://127.0.0.1:$llm_port/v1"
model = "fake-model"
tool_mode = "native"
TOML
# documents by URL may come from 127.0.0.1 only (e2e.mjs serves a page there); every other
# non-public address stays refused (the test checks that 10.0.0.1 is, before any connection);
# SIFT_URL_FETCH_LOOPBACK_ONLY: the node connects to nothing but loopback and asks no DNS
# (checked at the end: sift_url_fetch_outside_loopback_total stays 0)
SIFT_URL_FETCH_LOOPBACK_ONLY=true SIFT_URL_FETCH_ALLOW=127.0.0.1/32 SIFT_ADMIN_KEY=$key "$bin" serve --config "$work/sift.toml" --data-dir "$work/data" --listen "127.0.0.1:$port" \
  > "$work/node.log" 2>&1 &
node=$!
pids+=($node)
for _ in $(seq 600); do
  python3 -c "import urllib.request as u; u.urlopen('$node_url/readyz', timeout=1)" \
    2>/dev/null && break
  kill -0 $node 2>/dev/null || { cat "$work/node.log" >&2; exit 1; }
  sleep 0.2
done
status=0
CONSOLE_URL=$console_url API_BASE=$api_base SIFT_KEY=$key SCREENSHOTS=$screenshots \
  CHROMIUM=$(command -v chromium) node "$tests/e2e.mjs" || status=$?
if [[ $status -eq 0 ]]; then
  python3 - "$node_url" "$key" <<'PY' || status=$?
import sys, urllib.request
request = urllib.request.Request(sys.argv[1] + "/metrics", headers={"Authorization": "Bearer " + sys.argv[2]})
lines = urllib.request.urlopen(request, timeout=10).read().decode().splitlines()
series = [l for l in lines if l.startswith("sift_url_fetch_outside_loopback_total")]
if not series or any(float(l.rsplit(" ", 1)[1]) != 0 for l in series):
    sys.exit("console-e2e: the node tried to fetch outside loopback: %s" % series)
PY
fi
if [[ $status -ne 0 ]]; then
  echo "console-e2e: the node's log:" >&2
  tail -n 40 "$work/node.log" >&2
fi
exit $status
