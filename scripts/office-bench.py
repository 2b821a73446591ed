#!/usr/bin/env python3
"""DOCX and PPTX text: Sift's converters against python-docx and python-pptx, side by side.

    scripts/office-bench.py [FILE or folder ...]

Default: the `.docx` and `.pptx` files of the source distributions of python-docx,
python-pptx, mammoth and docxtpl (PyPI) and of the npm packages mammoth, docxtemplater,
docx4js and pptx2json, fetched with `pip download` and `npm pack` into a temporary folder:
the test documents those projects keep, written by Word, PowerPoint, LibreOffice and Google
Docs over the years (one file per name).

Builds `parse/examples/office_text.rs`, runs it on every file in one process, extracts each
file's text with python-docx (body paragraphs and tables, nested tables too) or python-pptx
(every shape's text frame, group shapes and tables included, and the notes) in a virtual
environment made here, and prints per-file and total figures: word-level recall of the
reference's words in Sift's text (a bag of lower-cased `\\w+` words), the files under 0.95,
and seconds of each ($OFFICE_TEXT_BIN names a built `office_text` to use instead). Sift reads more than the references (comments, for one), so precision
is not the measure; recall says what Sift misses. Files a reference cannot open are left out
and named. Needs: python3 with venv and pip, npm, cargo.
"""
import collections
import glob
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORD = re.compile(r"\w+")

REFERENCE = r'''
import sys, json, time
out = {}
for path in sys.argv[1:]:
    started = time.monotonic()
    try:
        if path.endswith(".docx"):
            import docx
            document = docx.Document(path)
            texts = []
            def table_texts(table):
                for row in table.rows:
                    for cell in row.cells:
                        texts.extend(p.text for p in cell.paragraphs)
                        for inner in cell.tables:
                            table_texts(inner)
            texts.extend(p.text for p in document.paragraphs)
            for table in document.tables:
                table_texts(table)
        else:
            import pptx
            from pptx.enum.shapes import MSO_SHAPE_TYPE
            deck = pptx.Presentation(path)
            texts = []
            def shape_texts(shape):
                if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
                    for inner in shape.shapes:
                        shape_texts(inner)
                    return
                if shape.has_text_frame:
                    texts.append(shape.text_frame.text)
                if getattr(shape, "has_table", False) and shape.has_table:
                    for row in shape.table.rows:
                        for cell in row.cells:
                            texts.append(cell.text)
            for slide in deck.slides:
                for shape in slide.shapes:
                    shape_texts(shape)
                if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
                    texts.append(slide.notes_slide.notes_text_frame.text)
        out[path] = {"text": "\n".join(texts), "seconds": time.monotonic() - started}
    except Exception as error:
        out[path] = {"error": f"{type(error).__name__}: {error}"[:120]}
print(json.dumps(out))
'''


def corpus(work):
    os.chdir(work)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                    "--no-deps", "python-docx", "python-pptx", "mammoth", "docxtpl"], check=True)
    subprocess.run(["npm", "pack", "-q", "mammoth", "docxtemplater", "docx4js", "pptx2json"],
                   check=True, capture_output=True)
    for archive in glob.glob("*.tar.gz") + glob.glob("*.tgz"):
        with tarfile.open(archive) as tar:
            tar.extractall(os.path.join(work, "src", os.path.basename(archive)))
    return [os.path.join(work, "src")]


def files(paths):
    found = []
    for path in paths:
        if os.path.isdir(path):
            for folder, _, names in os.walk(path):
                found += [os.path.join(folder, n) for n in names
                          if n.lower().endswith((".docx", ".pptx"))]
        else:
            found.append(path)
    # One name per file: the name names the outputs.
    by_name = {}
    for path in sorted(found):
        by_name.setdefault(os.path.basename(path), path)
    return sorted(by_name.values())


def recall(reference, ours):
    wanted = collections.Counter(w.lower() for w in WORD.findall(reference))
    got = collections.Counter(w.lower() for w in WORD.findall(ours))
    total = sum(wanted.values())
    if total == 0:
        return None, 0
    return sum(min(n, got[w]) for w, n in wanted.items()) / total, total


def main():
    work = tempfile.mkdtemp(prefix="sift-office-")
    paths = files(sys.argv[1:] or corpus(work))
    venv = os.path.join(work, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin/pip"), "install", "-q", "python-docx",
                    "python-pptx"], check=True)
    program = os.environ.get("OFFICE_TEXT_BIN")
    if program is None:
        subprocess.run(["cargo", "build", "-q", "--release", "-p", "sift-parse", "--example",
                        "office_text"], check=True, cwd=ROOT)
        program = os.path.join(ROOT, "target/release/examples/office_text")
    out = os.path.join(work, "out")
    os.makedirs(out)
    started = time.monotonic()
    lines = subprocess.run([program, out] + paths, check=True, capture_output=True,
                           text=True).stdout
    ours_seconds = time.monotonic() - started
    ours = {}
    for line in lines.splitlines():
        name, rest = line.split(" ", 1)
        ours[name] = rest
    started = time.monotonic()
    reference = __import__("json").loads(subprocess.run(
        [os.path.join(venv, "bin/python"), "-c", REFERENCE] + paths, check=True,
        capture_output=True, text=True).stdout)
    reference_seconds = time.monotonic() - started
    rows, skipped = [], []
    for path in paths:
        name = os.path.basename(path)
        ref = reference[path]
        if "error" in ref:
            skipped.append((name, "reference: " + ref["error"]))
            continue
        result = ours.get(name, "error missing")
        if result.startswith("error"):
            text = ""
            note = result
        else:
            text = open(os.path.join(out, name + ".txt")).read()
            note = ""
        value, words = recall(ref["text"], text)
        if value is None:
            skipped.append((name, "no words in the reference"))
            continue
        rows.append((name, words, value, note))
    for kind in (".docx", ".pptx"):
        part = [r for r in rows if r[0].lower().endswith(kind)]
        if not part:
            continue
        mean = sum(r[2] for r in part) / len(part)
        weighted = sum(r[2] * r[1] for r in part) / sum(r[1] for r in part)
        low = min(part, key=lambda r: r[2])
        under = [r for r in part if r[2] < 0.95]
        print(f"{kind}: {len(part)} files, {sum(r[1] for r in part)} reference words; recall "
              f"mean {mean:.3f}, word-weighted {weighted:.3f}, lowest {low[2]:.3f} ({low[0]}); "
              f"under 0.95: {len(under)}")
        for name, words, value, note in sorted(under, key=lambda r: r[2]):
            print(f"    {value:.3f} {name} ({words} words) {note}")
    print(f"seconds: Sift {ours_seconds:.2f} (one process), references {reference_seconds:.2f}")
    for name, why in skipped:
        print(f"left out: {name}: {why}")


if __name__ == "__main__":
    main()
