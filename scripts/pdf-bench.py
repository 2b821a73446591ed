#!/usr/bin/env python3
"""PDF text: Sift's extraction (pdf_oxide) and other candidates against pdftotext, side by side.

    scripts/pdf-bench.py [--candidate NAME=CMD ...] [--timeout S] [--sample N] [PDF or folder ...]

(default corpus: every PDF under /usr/share/doc). Builds `parse/examples/pdf_text.rs` in
release (into `$CARGO_TARGET_DIR`, else `target/`), runs it on every file in one process,
runs plain `pdftotext` (poppler-utils) per file as the reference and each candidate per file,
taking turns file by file (a load that changes during the run weighs on them alike): CMD is
split like a shell line, `{in}` replaced by the PDF, `{out}` by the text file to write and
`{dir}` by its folder (the file is named after the PDF's stem, `NAME.txt`), e.g.

    --candidate 'mupdf=mutool draw -q -F txt -o {out} {in}'
    --candidate 'pdf_oxide per process=target/release/examples/pdf_text {dir} {in}'

A candidate run ends as `ok` (exit 0, {out} written), `timeout` (past --timeout, default
60 s, or exit 124), `panicked` (exit 3 or 101: a Rust tool that caught or died of a panic),
`crashed` (killed by a signal) or `failed` (any other exit). Only files pdftotext reads and
finds words in are compared; for each tool it prints per-file F1 and then: files read and
not read by cause, word-level F1 against pdftotext (a bag of lower-cased `\\w+` words:
precision and recall of the multiset) as mean over the files it read, mean with a file not
read counted as 0, median, word-weighted and lowest, the share of files at 0.95 or more,
pages/s (pdfinfo's page count over the seconds on the files it read) and its speed against
pdftotext on those same files (pdftotext's seconds / its seconds). --sample N keeps every
k-th file of the sorted list so that N remain (the same files for every tool). Needs:
pdftotext, pdfinfo, cargo; the candidates' own programs.
"""
import argparse
import collections
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORD = re.compile(r"\w+")
SIFT = "pdf_oxide (sift)"


def pdfs(args, sample):
    paths = args or ["/usr/share/doc"]
    found = []
    for path in paths:
        if os.path.isdir(path):
            for folder, _, files in os.walk(path):
                found += [os.path.join(folder, f) for f in files if f.lower().endswith(".pdf")]
        else:
            found.append(path)
    # One name per file: the stem names the outputs.
    by_stem = {}
    for path in sorted(found):
        by_stem.setdefault(os.path.splitext(os.path.basename(path))[0], path)
    files = sorted(by_stem.values())
    if sample and len(files) > sample:
        step = len(files) / sample
        files = [files[int(i * step)] for i in range(sample)]
    return files


def stem_of(path):
    return os.path.splitext(os.path.basename(path))[0]


def words(text):
    return collections.Counter(WORD.findall(text.lower()))


def f1(ours, reference):
    common = sum((ours & reference).values())
    if not common:
        return 0.0
    precision = common / sum(ours.values())
    recall = common / sum(reference.values())
    return 2 * precision * recall / (precision + recall)


def run_sift(files, out_dir):
    """{stem: ("ok" or "error CODE", seconds)} and {stem: [pages read as tables]}."""
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "sift-parse", "--example", "pdf_text"],
        cwd=ROOT,
        check=True,
    )
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    binary = os.path.join(target, "release", "examples", "pdf_text")
    result = subprocess.run([binary, out_dir, *files], capture_output=True, text=True, check=True)
    outcomes, tables = {}, {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if parts[1] == "error":
            outcomes[parts[0]] = ("error " + parts[2], float(parts[3]) if len(parts) > 3 else 0.0)
        else:
            outcomes[parts[0]] = ("ok", float(parts[2]))
            if len(parts) > 4 and parts[4] != "-":
                tables[parts[0]] = parts[4].split(",")
    return outcomes, tables


def run_command(template, path, out, timeout):
    """Runs one candidate on one file: (status, seconds)."""
    command = [
        part.replace("{in}", path).replace("{out}", out).replace("{dir}", os.path.dirname(out))
        for part in shlex.split(template)
    ]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - started
    seconds = time.perf_counter() - started
    if done.returncode == 0 and os.path.exists(out):
        return "ok", seconds
    if done.returncode == 124:
        return "timeout", seconds
    if done.returncode in (3, 101):
        return "panicked", seconds
    if done.returncode < 0:
        return "crashed", seconds
    return "failed", seconds


def pages_of(path):
    info = subprocess.run(["pdfinfo", path], capture_output=True, text=True)
    return next((int(l.split()[1]) for l in info.stdout.splitlines() if l.startswith("Pages:")), 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidate", action="append", default=[], metavar="NAME=CMD")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--sample", type=int, default=0)
    parser.add_argument("paths", nargs="*")
    options = parser.parse_args()
    candidates = []
    for spec in options.candidate:
        name, _, command = spec.partition("=")
        if not command:
            parser.error(f"--candidate {spec!r}: NAME=CMD")
        candidates.append((name, command))

    files = pdfs(options.paths, options.sample)
    out = tempfile.mkdtemp(prefix="pdf-bench-")
    dirs = {name: os.path.join(out, re.sub(r"\W+", "-", name)) for name in
            ["pdftotext", SIFT] + [name for name, _ in candidates]}
    for folder in dirs.values():
        os.makedirs(folder)
    print(f"{len(files)} files; texts under {out}", flush=True)

    # Tool -> {stem: (status, seconds)}.
    runs = {}
    runs[SIFT], tables = run_sift(files, dirs[SIFT])
    # pdftotext and the candidates take turns file by file, so that a machine whose load
    # changes during the run weighs on each of them alike.
    reference, pages = {}, {}
    runs["pdftotext"] = reference
    for name, _ in candidates:
        runs[name] = {}
    for path in files:
        stem = stem_of(path)
        pages[stem] = pages_of(path)
        for name, command in [("pdftotext", "pdftotext -q {in} {out}")] + candidates:
            target = os.path.join(dirs[name], stem + ".txt")
            runs[name][stem] = run_command(command, path, target, options.timeout)

    def text_words(tool, stem):
        with open(os.path.join(dirs[tool], stem + ".txt"), errors="replace") as f:
            return words(f.read())

    tools = [SIFT] + [name for name, _ in candidates]
    compared, skipped, reference_words = [], [], {}
    for path in files:
        stem = stem_of(path)
        if reference[stem][0] != "ok":
            skipped.append(f"{stem} (pdftotext: {reference[stem][0]})")
            continue
        bag = text_words("pdftotext", stem)
        if not bag:
            skipped.append(f"{stem} (pdftotext found no words)")
            continue
        compared.append(stem)
        reference_words[stem] = bag

    scores = {tool: {} for tool in tools}
    header = f"{'file':40} {'pages':>6} {'pdftotext s':>11}" + "".join(
        f" {tool[:16]:>16} s {'F1':>6}" for tool in tools)
    print(header)
    for stem in compared:
        row = f"{stem[:40]:40} {pages[stem]:>6} {reference[stem][1]:>11.3f}"
        for tool in tools:
            status, seconds = runs[tool].get(stem, ("missing", 0.0))
            if status == "ok":
                scores[tool][stem] = f1(text_words(tool, stem), reference_words[stem])
                row += f" {seconds:>18.3f} {scores[tool][stem]:>6.3f}"
            else:
                row += f" {seconds:>18.3f} {status[:6]:>6}"
        print(row)
    if not compared:
        print("no file compared")
        return 1

    total_pages = sum(pages[stem] for stem in compared)
    reference_seconds = sum(reference[stem][1] for stem in compared)
    print()
    print(f"files compared: {len(compared)} of {len(files)}, pages: {total_pages}; "
          f"pdftotext {total_pages / reference_seconds:.0f} pages/s (a process per file)")
    print(f"| tool | files read | not read | F1 mean (read) | F1 mean (not read = 0) | "
          f"median | word-weighted | lowest | files >= 0.95 | pages/s | x pdftotext |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for tool in tools:
        read = scores[tool]
        causes = collections.Counter(
            runs[tool].get(stem, ("missing", 0.0))[0] for stem in compared if stem not in read)
        values = list(read.values())
        if not values:
            print(f"| {tool} | 0 | {dict(causes)} | | | | | | | | |")
            continue
        weights = [sum(reference_words[stem].values()) for stem in read]
        weighted = sum(s * w for s, w in zip(values, weights)) / sum(weights)
        seconds = sum(runs[tool][stem][1] for stem in read)
        their_seconds = sum(reference[stem][1] for stem in read)
        read_pages = sum(pages[stem] for stem in read)
        not_read = ", ".join(f"{n} {cause}" for cause, n in sorted(causes.items())) or "0"
        print(f"| {tool} | {len(values)} | {not_read} | {statistics.mean(values):.3f} | "
              f"{sum(values) / len(compared):.3f} | {statistics.median(values):.3f} | "
              f"{weighted:.3f} | {min(values):.3f} | "
              f"{sum(v >= 0.95 for v in values) / len(compared):.1%} | "
              f"{read_pages / seconds:.0f} | {their_seconds / seconds:.2f} |")
    print(f"pages read as Markdown for a table by sift: {sum(len(p) for p in tables.values())} "
          f"in {len(tables)} files")
    for stem, table_pages in sorted(tables.items()):
        print(f"  tables: {stem} pages {','.join(table_pages)}")
    for line in skipped:
        print(f"left out: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
