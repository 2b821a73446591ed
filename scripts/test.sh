#!/usr/bin/env bash
# The whole test suite: fetches the embedded model if absent and makes the Python environment
# of the real OpenAI clients (scripts/client-venv.sh, from PyPI) if absent, then runs every
# test of the workspace. This is what CI runs (.ci/run).
#
# The integration tests are one binary (tests/tests/main.rs); it runs here one module (one
# file) at a time, with the tests of a module in parallel, so that the multi-process tests
# of one file never share the machine's two cores with another file's nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$(scripts/fetch-model.sh)}
# the official openai SDK and LangChain for the real-client test (tests/tests/clients.rs)
export SIFT_CLIENTS_PYTHON=${SIFT_CLIENTS_PYTHON:-$(scripts/client-venv.sh)}
cargo fmt --all -- --check
failed=()
cargo test --workspace --exclude sift-tests --all-targets --no-fail-fast || failed+=("workspace")
cargo test -p sift-tests --lib --no-fail-fast || failed+=("sift-tests lib")
for module in $(sed -n 's/^mod \([a-z0-9_]*\);$/\1/p' tests/tests/main.rs); do
  cargo test -p sift-tests --test integration --no-fail-fast -- "$module::" || failed+=("$module")
done
if ((${#failed[@]})); then
  echo "test.sh: failures in: ${failed[*]}" >&2
  exit 1
fi
