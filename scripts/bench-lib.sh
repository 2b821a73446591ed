# Shared by the cluster benchmark scripts (sourced, not run): picks the binaries, tracks the
# processes started so that they are killed on exit, reads a process's CPU time, and gives
# every node one admin key (SIFT_ADMIN_KEY) that sift-bench and `api` (curl) send.
# Needs `repo` set; takes BIN_DIR as $1 (empty: target/release if built, else target/debug).
pick_bin() {
  if [ -n "${1:-}" ]; then
    echo "$1"
  elif [ -x "$repo/target/release/sift" ] && [ -x "$repo/target/release/sift-bench" ]; then
    echo "$repo/target/release"
  else
    echo "$repo/target/debug"
  fi
}
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
cpu_seconds() { # pid -> utime+stime in seconds
  awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat"
}

# One admin key for the nodes of this run, sent by sift-bench (SIFT_API_KEY) and by `api`.
SIFT_ADMIN_KEY=${SIFT_ADMIN_KEY:-sk-sift-$(python3 -c 'import secrets; print(secrets.token_hex(6) + "-" + secrets.token_hex(24))')}
export SIFT_ADMIN_KEY
export SIFT_API_KEY=$SIFT_ADMIN_KEY
api() { curl -sf -H "Authorization: Bearer $SIFT_API_KEY" "$@"; }
