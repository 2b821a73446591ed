#!/usr/bin/env bash
# The chaos soak: five `sift serve` nodes in cluster mode, each in its own network namespace
# joined by a bridge, each data dir on its own small tmpfs; a seeded nemesis (kill -9,
# SIGSTOP/SIGCONT, restarts, minority/majority/bridge partitions by blackhole routes, slow
# links by tc netem where the kernel has it else tc tbf, a full disk) while clients ingest,
# delete, search, ask agent sessions and change a KB's settings; then the checker
# (tests/src/chaos/). Prints and writes a JSON summary; exits non-zero on any anomaly.
#
# Usage: scripts/chaos.sh SECONDS [--seed N] [--out FILE] [--release]   (as root)
# Needs: ip (iproute2) with netns, veth and bridge; tc; tmpfs. The embedded model
# (scripts/fetch-model.sh). Node logs stay in the work folder it prints.
set -euo pipefail

usage() {
  echo "usage: scripts/chaos.sh SECONDS [--seed N] [--out FILE] [--release]" >&2
  exit 2
}
[[ $# -ge 1 && $1 =~ ^[0-9]+$ ]] || usage
duration=$1
shift
seed=$(date +%s)
out=""
profile=debug
while [[ $# -gt 0 ]]; do
  case $1 in
    --seed) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || usage; seed=$2; shift 2 ;;
    --out) [[ $# -ge 2 ]] || usage; out=$2; shift 2 ;;
    --release) profile=release; shift ;;
    *) usage ;;
  esac
done
if [[ $(id -u) -ne 0 ]]; then
  echo "error: the chaos soak must run as root: it makes network namespaces, veth pairs," \
    "a bridge, blackhole routes, tc qdiscs and tmpfs mounts" >&2
  exit 2
fi
for tool in ip tc mount; do
  command -v "$tool" >/dev/null || { echo "error: $tool is required" >&2; exit 2; }
done

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$(scripts/fetch-model.sh)}
build_flags=()
[[ $profile == release ]] && build_flags=(--release)
cargo build "${build_flags[@]}" -p sift-tests --bin sift-under-test --bin sift-chaos
target=${CARGO_TARGET_DIR:-$repo/target}/$profile

nodes=5
prefix=siftchaos
net=10.77.0
work=$(mktemp -d /tmp/sift-chaos.XXXXXX)
out=${out:-$work/summary.json}
echo "chaos soak: ${duration}s, seed $seed, work folder $work" >&2

cleanup() {
  for i in $(seq 1 $nodes); do
    for pid in $(ip netns pids "$prefix-n$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  sleep 0.5
  for i in $(seq 1 $nodes); do
    umount "$work/n$i" 2>/dev/null || true
    ip netns del "$prefix-n$i" 2>/dev/null || true
  done
  ip link del "$prefix-h" 2>/dev/null || true
  ip netns del "$prefix-br" 2>/dev/null || true
}
trap cleanup EXIT
cleanup # what an interrupted run left

# The bridge lives in a namespace of its own; each node's veth ends there, and so does one from
# the root namespace, through which the driver reaches the nodes (10.77.0.254).
ip netns add "$prefix-br"
ip -n "$prefix-br" link add br0 type bridge
ip -n "$prefix-br" link set br0 up
ip -n "$prefix-br" link set lo up
for i in $(seq 1 $nodes); do
  ns=$prefix-n$i
  ip netns add "$ns"
  ip link add "v$i" netns "$prefix-br" type veth peer name eth0 netns "$ns"
  ip -n "$prefix-br" link set "v$i" master br0 up
  ip -n "$ns" addr add "$net.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  mkdir -p "$work/n$i"
  mount -t tmpfs -o size=384m tmpfs "$work/n$i"
done
ip link add "$prefix-h" type veth peer name vh netns "$prefix-br"
ip -n "$prefix-br" link set vh master br0 up
ip addr add "$net.254/24" dev "$prefix-h"
ip link set "$prefix-h" up

status=0
"$target/sift-chaos" --seconds "$duration" --seed "$seed" --out "$out" \
  --binary "$target/sift-under-test" --netns-prefix "$prefix" --net "$net" --work "$work" \
  --nodes $nodes || status=$?
echo "summary: $out; node logs: $work/logs" >&2
exit $status
