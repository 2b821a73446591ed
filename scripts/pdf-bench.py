#!/usr/bin/env python3
"""PDF text: Sift's extraction (pdf_oxide) against pdftotext (poppler-utils), side by side.

    scripts/pdf-bench.py [PDF or folder ...]     (default: every PDF under /usr/share/doc)

Builds `parse/examples/pdf_text.rs` in release, runs it on every file in one process, runs
`pdftotext -layout`-less plain `pdftotext` per file, then prints per-file and total figures:
pages, seconds of each, and word-level F1 of Sift's text against pdftotext's (a bag of
lower-cased `\\w+` words: precision and recall of the multiset), and the pages Sift read as
Markdown because it found a table on them. Files pdftotext cannot read
or with no words are left out of F1 and named. Needs: pdftotext, pdfinfo (Debian
poppler-utils), cargo.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORD = re.compile(r"\w+")


def pdfs(args):
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
    return sorted(by_stem.values())


def words(text):
    return collections.Counter(WORD.findall(text.lower()))


def f1(ours, reference):
    common = sum((ours & reference).values())
    if not common:
        return 0.0
    precision = common / sum(ours.values())
    recall = common / sum(reference.values())
    return 2 * precision * recall / (precision + recall)


def main():
    files = pdfs(sys.argv[1:])
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "sift-parse", "--example", "pdf_text"],
        cwd=ROOT,
        check=True,
    )
    binary = os.path.join(ROOT, "target", "release", "examples", "pdf_text")
    out = tempfile.mkdtemp(prefix="pdf-bench-")
    ours_dir, theirs_dir = os.path.join(out, "sift"), os.path.join(out, "pdftotext")
    os.makedirs(ours_dir)
    os.makedirs(theirs_dir)

    ours = {}
    tables = {}
    result = subprocess.run([binary, ours_dir, *files], capture_output=True, text=True, check=True)
    for line in result.stdout.splitlines():
        parts = line.split()
        if parts[1] == "error":
            ours[parts[0]] = ("error " + parts[2], float(parts[3]) if len(parts) > 3 else 0.0)
        else:
            ours[parts[0]] = (int(parts[1]), float(parts[2]))
            if len(parts) > 4 and parts[4] != "-":
                tables[parts[0]] = parts[4].split(",")

    theirs = {}
    for path in files:
        stem = os.path.splitext(os.path.basename(path))[0]
        started = time.perf_counter()
        done = subprocess.run(
            ["pdftotext", "-q", path, os.path.join(theirs_dir, stem + ".txt")],
            capture_output=True,
        )
        seconds = time.perf_counter() - started
        info = subprocess.run(["pdfinfo", path], capture_output=True, text=True)
        pages = next(
            (int(l.split()[1]) for l in info.stdout.splitlines() if l.startswith("Pages:")), 0
        )
        theirs[stem] = (pages if done.returncode == 0 else "error", seconds)

    print(f"{'file':40} {'pages':>6} {'sift s':>8} {'pdftotext s':>11} {'F1':>6}")
    scores, weights, skipped = [], [], []
    total = {"pages": 0, "ours": 0.0, "theirs": 0.0}
    for path in files:
        stem = os.path.splitext(os.path.basename(path))[0]
        our_pages, our_seconds = ours.get(stem, ("missing", 0.0))
        their_pages, their_seconds = theirs[stem]
        if isinstance(their_pages, str) or isinstance(our_pages, str):
            skipped.append(f"{stem} (sift: {our_pages}, pdftotext: {their_pages})")
            continue
        reference = words(open(os.path.join(theirs_dir, stem + ".txt"), errors="replace").read())
        if not reference:
            skipped.append(f"{stem} (pdftotext found no words)")
            continue
        score = f1(words(open(os.path.join(ours_dir, stem + ".txt")).read()), reference)
        scores.append(score)
        weights.append(sum(reference.values()))
        total["pages"] += their_pages
        total["ours"] += our_seconds
        total["theirs"] += their_seconds
        print(f"{stem[:40]:40} {their_pages:>6} {our_seconds:>8.3f} {their_seconds:>11.3f} {score:>6.3f}")
    if not scores:
        print("no file compared")
        return 1
    mean = sum(scores) / len(scores)
    weighted = sum(s * w for s, w in zip(scores, weights)) / sum(weights)
    print()
    print(f"files compared: {len(scores)}, pages: {total['pages']}")
    print(f"word F1 against pdftotext: mean {mean:.3f}, word-weighted {weighted:.3f}, "
          f"min {min(scores):.3f}; files under 0.95: {sum(s < 0.95 for s in scores)}")
    print(f"pages/s: sift {total['pages'] / total['ours']:.0f} "
          f"(in one process), pdftotext {total['pages'] / total['theirs']:.0f} (a process per file)")
    print(f"pages read as Markdown for a table: {sum(len(p) for p in tables.values())} "
          f"in {len(tables)} files")
    for stem, pages in sorted(tables.items()):
        print(f"  tables: {stem} pages {','.join(pages)}")
    for line in skipped:
        print(f"left out: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
