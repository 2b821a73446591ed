#!/usr/bin/env bash
# OCR throughput with tesseract, side by side in one sitting: a scanned PDF of PAGES A4 pages
# (300 dpi, grey, paragraphs of text) ingested by a node whose KB reads scans with
# tesseract (parse, page images saved, OCR two pages at a time, chunk, embed, index), against
# tesseract alone on the same page image PAGES times, one and two at a time.
#
#   scripts/ocr-bench.sh [PAGES]        (default 20)
#
# Needs: tesseract with English (Debian tesseract-ocr), ImageMagick's convert (Debian
# imagemagick; $CONVERT names another), curl, python3, the embedded model
# (scripts/fetch-model.sh), a built ./target/debug/sift (or $SIFT_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
pages=${1:-20}
convert=${CONVERT:-convert}
sift=${SIFT_BIN:-./target/debug/sift}
port=7791
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
export SIFT_MODEL_DIR=${SIFT_MODEL_DIR:-$(scripts/fetch-model.sh)}
key=sk-sift-$(python3 -c 'import secrets; print(secrets.token_hex(6) + "-" + secrets.token_hex(24))')

# One page: an A4 scan at 300 dpi, 2480 x 3508 grey pixels, with a page of prose (about 60
# lines of 70 characters).
python3 - "$convert" "$work/page.png" <<'EOF'
import subprocess, sys, textwrap
sentences = [
    "The harbour light at Ardmore flashes green every four seconds.",
    "Pilots board inbound vessels at the outer buoy in all weathers.",
    "Spring tides at the estuary rise seven metres above the datum.",
    "The keepers logged each high water in a ledger beside the barometer.",
    "Fog signals sound from the pier head whenever visibility falls.",
]
lines = []
for paragraph in range(9):
    text = " ".join(sentences[(paragraph + j) % len(sentences)] for j in range(6))
    lines += textwrap.wrap(text, 70) + [""]
command = [sys.argv[1], "-size", "2480x3508", "xc:white", "-font", "DejaVu-Sans",
           "-pointsize", "42", "-fill", "black"]
for number, line in enumerate(lines[:62]):
    if line:
        command += ["-annotate", "+150+%d" % (200 + number * 52), line]
command += ["-colorspace", "Gray", "-depth", "8", sys.argv[2]]
subprocess.run(command, check=True)
EOF
"$convert" "$work/page.png" -depth 8 gray:"$work/page.gray"

# The scanned PDF: PAGES pages, each painting the page image (raw grey, Flate-compressed),
# written by the PDF fixtures' writer (tests/fixtures/pdf/make.py).
python3 - "$work/page.gray" "$pages" "$work/scan.pdf" <<'EOF'
import sys
sys.path.insert(0, "tests/fixtures/pdf")
from make import write_pdf
pixels, count, out_path = open(sys.argv[1], "rb").read(), int(sys.argv[2]), sys.argv[3]
objects = [b"<< /Type /Catalog /Pages 2 0 R >>", None]
kids = []
for page in range(count):
    image = len(objects) + 1
    objects.append((b"/Type /XObject /Subtype /Image /Width 2480 /Height 3508 "
                    b"/ColorSpace /DeviceGray /BitsPerComponent 8", pixels))
    objects.append((b"", b"q 595 0 0 842 0 0 cm /Im1 Do Q"))
    kids.append(len(objects) + 1)
    objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] "
                   b"/Resources << /XObject << /Im1 %d 0 R >> >> /Contents %d 0 R >>"
                   % (image, image + 1))
objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
    b" ".join(b"%d 0 R" % k for k in kids), count)
write_pdf(out_path, objects, compress=True)
EOF

now() { python3 -c 'import time; print(time.monotonic())'; }
rate() { python3 -c "import sys; n, a, b = map(float, sys.argv[1:]); print(f'{n / (b - a):.3f} pages/s ({b - a:.1f} s)')" "$@"; }

# tesseract as Sift runs it: one thread per process (OMP_THREAD_LIMIT=1), two at a time;
# then one at a time with its default threads.
echo "== tesseract alone, ${pages} pages, two at a time, one thread each"
start=$(now)
seq 1 "$pages" | OMP_THREAD_LIMIT=1 xargs -P 2 -I{} sh -c "tesseract '$work/page.png' stdout -l eng > /dev/null 2>&1"
end=$(now)
echo "tesseract x2: $(rate "$pages" "$start" "$end")"

echo "== tesseract alone, ${pages} pages, one at a time, its default threads"
start=$(now)
for _ in $(seq 1 "$pages"); do tesseract "$work/page.png" stdout -l eng > /dev/null 2>&1; done
end=$(now)
echo "tesseract x1: $(rate "$pages" "$start" "$end")"

echo "== Sift: the ${pages}-page scanned PDF ingested with tesseract"
SIFT_ADMIN_KEY=$key "$sift" serve --data-dir "$work/data" --listen "127.0.0.1:$port" \
  > "$work/node.log" 2>&1 &
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/readyz" > /dev/null && break; sleep 0.2; done
auth=(-H "Authorization: Bearer $key")
curl -sf "${auth[@]}" -H 'content-type: application/json' \
  -d '{"name": "scans", "ocr": "tesseract"}' "http://127.0.0.1:$port/v1/kbs" > /dev/null
start=$(now)
id=$(curl -sf "${auth[@]}" -F "file=@$work/scan.pdf" "http://127.0.0.1:$port/v1/kbs/scans/documents" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["documents"][0]["id"])')
while :; do
  record=$(curl -sf "${auth[@]}" "http://127.0.0.1:$port/v1/kbs/scans/documents/$id")
  status=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["status"])' "$record")
  [[ $status == ready || $status == failed ]] && break
  sleep 0.2
done
end=$(now)
echo "sift: $status, $(python3 -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["chunk_count"], "chunks,", r["pages_needing_ocr"], "pages needing OCR")' "$record")"
echo "sift end to end: $(rate "$pages" "$start" "$end")"
curl -sf "${auth[@]}" "http://127.0.0.1:$port/metrics" \
  | grep -E '^sift_(ocr_seconds|ingest_stage_seconds)_(sum|count)' || true
