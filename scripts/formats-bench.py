#!/usr/bin/env python3
"""Ingesting large documents end to end, with the node's memory watched (issue 17 items 8 and
the 300-page figure).

    scripts/formats-bench.py [--only NAME ...] [--csv-rows N] [--xlsx-rows N]

Each workload runs on a fresh node (`sift serve`, release build by default) and reports: the
time from upload to `ready` (or `failed` and its reason), the stage times from `/metrics`
(`sift_ingest_stage_seconds`), the node's resident memory idle before the upload and at its
peak (`VmHWM`), and the largest resident memory of a parse worker process seen while it ran
(sampled every 20 ms from `/proc`), the node's peak in each status of the document, its
resident memory once the document is ready, and, restarted on the same data, after one search.

Workloads:
- `pdf300`: `/usr/share/doc/gnuplot/gnuplot.pdf` (311 pages; Debian's gnuplot-doc), embedded
  MiniLM model: the end-to-end figure and the share of parsing against embedding.
- `pdf500`: `/usr/share/doc/texlive-doc/latex/koma-script/scrguide-en.pdf` (566 pages;
  texlive-latex-recommended-doc), embeddings from `scripts/embed-server.py` (hash vectors at
  fixed cost), for memory.
- `csv100`: an 85 MB CSV written here (180,000 rows of five columns of prose; `--csv-rows`
  for another size: 200,000, the default `sheet_max_rows`, make 94 MB), hash embeddings.
- `xlsx100`: an XLSX written here (one million rows of three cells of inline strings, 40 MB
  zipped; `--xlsx-rows` for fewer), hash embeddings: it unpacks past the 256 MiB cap and is
  refused with `document_too_large`; its memory is the figure. With `--xlsx-rows 150000` it
  is taken and indexed.

The node's settings come from the environment as usual: `SIFT_INGEST_STREAM_BYTES=
9223372036854775807` parses and chunks a spreadsheet whole instead of a run of rows at a time
(ADR 0036), for a before/after on one build.

Needs: a built `target/release/sift` (or $SIFT_BIN), the embedded model
(scripts/fetch-model.sh), python3, the two Debian doc packages.
"""
import argparse
import json
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIFT = os.environ.get("SIFT_BIN", os.path.join(ROOT, "target/release/sift"))
PORT = 7795
EMBED_PORT = 7796
WORDS = (
    "harbour light keeper lens prism beam tide ledger barometer pilot vessel anchorage pier "
    "signal fog estuary buoy channel chart sounding reef storm lantern tower gallery winter "
    "record ship cargo customs quay crane dock berth mooring rope hull keel mast sail"
).split()


def status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


class Watcher(threading.Thread):
    """The largest VmRSS of any child process of `pid`, and of the node in each stage of the
    document (`stage`, set by the caller as it polls), sampled every 20 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_child_kib, self.stop = pid, 0, False
        self.stage, self.peak_by_stage = "uploading", {}

    def run(self):
        while not self.stop:
            for child in children(self.pid):
                rss = status_kib(child, "VmRSS") or 0
                self.peak_child_kib = max(self.peak_child_kib, rss)
            rss = status_kib(self.pid, "VmRSS") or 0
            stage = self.stage
            self.peak_by_stage[stage] = max(self.peak_by_stage.get(stage, 0), rss)
            time.sleep(0.02)


def request(method, path, key, body=None, content_type=None):
    data = body
    headers = {"Authorization": f"Bearer {key}"}
    if isinstance(body, dict):
        data = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    elif content_type:
        headers["content-type"] = content_type
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=data, method=method,
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=600) as response:
        raw = response.read()
        return json.loads(raw) if raw[:1] in (b"{", b"[") else raw.decode()


def upload(key, kb, path):
    boundary = "sift" + secrets.token_hex(8)
    name = os.path.basename(path)
    with open(path, "rb") as f:
        content = f.read()
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{name}\"\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    try:
        return request("POST", f"/v1/kbs/{kb}/documents", key, body,
                       f"multipart/form-data; boundary={boundary}")
    except urllib.error.HTTPError as error:
        return {"refused": error.code, "body": error.read().decode()[:300]}


def stage_seconds(key):
    metrics = request("GET", "/metrics", key)
    stages = {}
    for line in metrics.splitlines():
        found = re.match(r'sift_ingest_stage_seconds_sum\{stage="(\w+)"\} (\S+)', line)
        if found:
            stages[found.group(1)] = float(found.group(2))
    return stages


def run(name, path, hash_embeddings, work, extra_env=None):
    data = tempfile.mkdtemp(dir=work)
    key = "sk-sift-" + secrets.token_hex(6) + "-" + secrets.token_hex(24)
    env = dict(os.environ, SIFT_ADMIN_KEY=key)
    env.update(extra_env or {})
    config = os.path.join(data, "sift.toml")
    with open(config, "w") as f:
        f.write(f'[embedding.remote.hash]\nbase_url = "http://127.0.0.1:{EMBED_PORT}/v1"\n'
                f'model = "hash"\ndimension = 384\n')
    log = open(os.path.join(data, "node.log"), "w")
    node = subprocess.Popen([SIFT, "serve", "--config", config, "--data-dir",
                             os.path.join(data, "data"), "--listen", f"127.0.0.1:{PORT}"],
                            env=env, stdout=log, stderr=log)
    def wait_ready():
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)

    try:
        wait_ready()
        kb = {"name": "big"}
        if hash_embeddings:
            kb["embedding_model"] = "hash"
        request("POST", "/v1/kbs", key, kb)
        time.sleep(1.0)
        idle = status_kib(node.pid, "VmRSS")
        watcher = Watcher(node.pid)
        watcher.start()
        started = time.monotonic()
        added = upload(key, "big", path)
        if "refused" in added:
            elapsed = time.monotonic() - started
            watcher.stop = True
            outcome = f"refused {added['refused']}: {added['body']}"
            record = {}
        else:
            doc = added["documents"][0]["id"]
            while True:
                record = request("GET", f"/v1/kbs/big/documents/{doc}", key)
                watcher.stage = record["status"]
                if record["status"] in ("ready", "failed"):
                    break
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            watcher.stop = True
            outcome = record["status"] + (f" ({record.get('error')})" if record.get("error") else "")
        peak = status_kib(node.pid, "VmHWM")
        settled = status_kib(node.pid, "VmRSS")
        stages = stage_seconds(key)
        size = os.path.getsize(path)
        print(f"== {name}: {os.path.basename(path)}, {size / 1e6:.1f} MB")
        print(f"   outcome: {outcome}; {record.get('chunk_count', 0)} chunks; "
              f"{elapsed:.1f} s upload to the end")
        print("   stages (s): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(stages.items())))
        print(f"   node RSS: idle {idle / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB, "
              f"after {settled / 1024:.0f} MiB; "
              f"largest parse worker seen: {watcher.peak_child_kib / 1024:.0f} MiB")
        print("   node RSS peak by document status (MiB): " + ", ".join(
            f"{stage} {kib / 1024:.0f}" for stage, kib in watcher.peak_by_stage.items()))
        if record.get("status") == "ready":
            # The same data at rest: the node restarted on it, after one search.
            node.terminate()
            node.wait()
            node = subprocess.Popen([SIFT, "serve", "--config", config, "--data-dir",
                                     os.path.join(data, "data"), "--listen",
                                     f"127.0.0.1:{PORT}"], env=env, stdout=log, stderr=log)
            wait_ready()
            request("POST", "/v1/kbs/big/search", key, {"query": "harbour light", "top_k": 5})
            time.sleep(2.0)
            print(f"   node RSS restarted on the data, after a search: "
                  f"{status_kib(node.pid, 'VmRSS') / 1024:.0f} MiB")
        return elapsed, stages
    finally:
        node.terminate()
        node.wait()


def write_csv(path, rows):
    rng = random.Random(7)
    with open(path, "w") as f:
        f.write("id,place,keeper,entry,remarks\n")
        for row in range(rows):
            entry = " ".join(rng.choice(WORDS) for _ in range(45))
            remarks = " ".join(rng.choice(WORDS) for _ in range(25))
            f.write(f"{row},{rng.choice(WORDS)} point,{rng.choice(WORDS)},{entry},{remarks}\n")


def write_xlsx(path, rows):
    rng = random.Random(7)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml",
                   '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/'
                   '2006/content-types"><Default Extension="rels" ContentType="application/vnd.'
                   'openxmlformats-package.relationships+xml"/><Default Extension="xml" '
                   'ContentType="application/xml"/><Override PartName="/xl/workbook.xml" '
                   'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.'
                   'sheet.main+xml"/><Override PartName="/xl/worksheets/sheet1.xml" ContentType='
                   '"application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
                   '</Types>')
        z.writestr("_rels/.rels",
                   '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/'
                   'package/2006/relationships"><Relationship Id="r1" Type="http://schemas.'
                   'openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
                   'Target="xl/workbook.xml"/></Relationships>')
        z.writestr("xl/workbook.xml",
                   '<?xml version="1.0"?><workbook xmlns="http://schemas.openxmlformats.org/'
                   'spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/'
                   'officeDocument/2006/relationships"><sheets><sheet name="Log" sheetId="1" '
                   'r:id="r1"/></sheets></workbook>')
        z.writestr("xl/_rels/workbook.xml.rels",
                   '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/'
                   'package/2006/relationships"><Relationship Id="r1" Type="http://schemas.'
                   'openxmlformats.org/officeDocument/2006/relationships/worksheet" '
                   'Target="worksheets/sheet1.xml"/></Relationships>')
        with z.open("xl/worksheets/sheet1.xml", "w", force_zip64=True) as sheet:
            sheet.write(b'<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.'
                        b'org/spreadsheetml/2006/main"><sheetData>')
            for row in range(1, rows + 1):
                cells = "".join(
                    f'<c r="{col}{row}" t="inlineStr"><is><t>'
                    + " ".join(rng.choice(WORDS) for _ in range(6)) + "</t></is></c>"
                    for col in "ABC")
                sheet.write(f'<row r="{row}">{cells}</row>'.encode())
            sheet.write(b"</sheetData></worksheet>")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--csv-rows", type=int, default=180_000,
                        help="rows of the csv100 workload (180,000 make about 85 MB)")
    parser.add_argument("--xlsx-rows", type=int, default=1_000_000,
                        help="rows of the xlsx100 workload (a million: refused at the caps)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="sift-formats-")
    embed = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts/embed-server.py"),
                              "--listen", f"127.0.0.1:{EMBED_PORT}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.setdefault("SIFT_MODEL_DIR", subprocess.run(
        [os.path.join(ROOT, "scripts/fetch-model.sh")], check=True, capture_output=True,
        text=True).stdout.strip())
    try:
        wanted = lambda name: args.only is None or name in args.only
        if wanted("pdf300"):
            run("pdf300", "/usr/share/doc/gnuplot/gnuplot.pdf", False, work)
        if wanted("pdf500"):
            run("pdf500", "/usr/share/doc/texlive-doc/latex/koma-script/scrguide-en.pdf",
                True, work)
        if wanted("csv100"):
            path = os.path.join(work, "log-100mb.csv")
            write_csv(path, args.csv_rows)
            run("csv100", path, True, work)
        if wanted("xlsx100"):
            path = os.path.join(work, "log-100mb.xlsx")
            write_xlsx(path, args.xlsx_rows)
            run("xlsx100", path, True, work)
    finally:
        embed.terminate()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
