#!/usr/bin/env bash
# Fuzzes Sift's parsers and decoders: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Builds the cargo-fuzz project in fuzz/ (installing cargo-fuzz if missing; needs a nightly
# toolchain), then runs each target (default: all of them) for SECONDS_PER_TARGET seconds
# (default 60), starting from the committed seeds (fuzz/seeds/TARGET, copied into a scratch
# corpus so they do not grow) with fuzz/dicts/TARGET.dict when there is one. Prints a table of
# executions, time and new crash artifacts (fuzz/artifacts/TARGET/) per target, and exits
# non-zero if any target found one. Logs: fuzz/target/fuzz-logs/TARGET.log.
#
# Environment:
#   SIFT_FUZZ_FEATURES=cluster  also build and run cluster_frames (sift-cluster: a much longer
#                               build, tantivy, sled and reqwest under it)
#   SIFT_FUZZ_FEATURES=node     also build and run config_file (sift-node: the whole engine);
#                               both: SIFT_FUZZ_FEATURES=cluster,node
#   parse_pdf is built (with pdf_oxide, the `pdf` feature) and run only when named: it finds
#   a known hang inside pdf_oxide within seconds (ADR 0024)
#   SIFT_FUZZ_CORPUS=DIR        keep each target's corpus in DIR/TARGET across runs instead
#                               of a scratch copy (seeded from fuzz/seeds when new)
set -euo pipefail

seconds=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_dir="$root/fuzz"
features=${SIFT_FUZZ_FEATURES:-}

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

if (($# > 0)); then
    targets=("$@")
    if [[ " $* " == *" parse_pdf "* && $features != *pdf* ]]; then
        features=${features:+$features,}pdf
    fi
else
    targets=()
    while read -r target; do
        # cluster_frames needs sift-cluster (the `cluster` feature).
        if [[ $target == cluster_frames && $features != *cluster* ]]; then
            continue
        fi
        # config_file needs sift-node (the `node` feature).
        if [[ $target == config_file && $features != *node* ]]; then
            continue
        fi
        # parse_pdf finds a known hang inside pdf_oxide within seconds (ADR 0024): only when
        # named, so that the default run (CI's) stays a regression check.
        if [[ $target == parse_pdf ]]; then
            continue
        fi
        targets+=("$target")
    done < <(cargo +nightly fuzz list --fuzz-dir "$fuzz_dir")
fi
feature_args=()
if [[ -n $features ]]; then
    feature_args=(--features "$features")
fi

echo "== building the fuzz targets"
build_start=$SECONDS
cargo +nightly fuzz build --fuzz-dir "$fuzz_dir" "${feature_args[@]}"
echo "== built in $((SECONDS - build_start)) s"

logs="$fuzz_dir/target/fuzz-logs"
mkdir -p "$logs"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

count_artifacts() {
    find "$fuzz_dir/artifacts/$1" -type f \( -name 'crash-*' -o -name 'oom-*' \
        -o -name 'timeout-*' -o -name 'leak-*' \) 2>/dev/null | wc -l
}

rows=()
failed=0
for target in "${targets[@]}"; do
    if [[ -n ${SIFT_FUZZ_CORPUS:-} ]]; then
        corpus="$SIFT_FUZZ_CORPUS/$target"
    else
        corpus="$scratch/$target"
    fi
    mkdir -p "$corpus" "$fuzz_dir/artifacts/$target"
    if [[ -d $fuzz_dir/seeds/$target ]]; then
        cp -n "$fuzz_dir/seeds/$target"/* "$corpus"/ 2>/dev/null || true
    fi
    args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1)
    if [[ -f $fuzz_dir/dicts/$target.dict ]]; then
        args+=(-dict="$fuzz_dir/dicts/$target.dict")
    fi
    before=$(count_artifacts "$target")
    echo "== fuzzing $target for ${seconds} s"
    start=$SECONDS
    status=0
    cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" "${feature_args[@]}" "$target" "$corpus" \
        -- "${args[@]}" >"$logs/$target.log" 2>&1 || status=$?
    elapsed=$((SECONDS - start))
    executions=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$target.log" \
        | tail -1 | grep -o '[0-9]*$' || true)
    new=$(($(count_artifacts "$target") - before))
    if ((status != 0 || new > 0)); then
        failed=1
        echo "!! $target: exit $status, $new new artifact(s); see $logs/$target.log"
        grep -m1 -A12 -E '^(thread .* panicked|==[0-9]+==ERROR)' "$logs/$target.log" || true
        ls -t "$fuzz_dir/artifacts/$target" | head -n "$((new > 0 ? new : 1))" \
            | sed "s|^|   artifact: fuzz/artifacts/$target/|"
    fi
    rows+=("$(printf '%-16s %12s %8s %8s %6s' "$target" "${executions:-?}" "${elapsed}s" \
        "$new" "$status")")
done

echo
printf '%-16s %12s %8s %8s %6s\n' target executions time crashes exit
for row in "${rows[@]}"; do
    echo "$row"
done
exit "$failed"
