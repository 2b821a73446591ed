#!/usr/bin/env bash
# The whole test suite: fetches the embedded model if absent, then runs every test of the
# workspace. This is what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$(scripts/fetch-model.sh)}
cargo fmt --all -- --check
cargo test --workspace --all-targets --no-fail-fast
