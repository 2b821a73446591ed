#!/usr/bin/env bash
# The main job on embedded defaults: fetches the embedding model if absent, builds `sift`,
# starts a single node in .sift-demo/, loads samples/, runs a few searches, prints cited hits.
set -euo pipefail
cd "$(dirname "$0")/.."
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$(scripts/fetch-model.sh)}
cargo build --bin sift
SIFT_LOG=${SIFT_LOG:-warn} ./target/debug/sift demo "$@"
