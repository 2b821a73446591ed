#!/usr/bin/env python3
"""The LLM graph extractor on real passages (ADR 0038, run G3): cost and what it found.

Creates a KB with `graph = "llm"` on a running node whose `[llm]` names a real model (e.g.
`../shared/tools/real-llm.sh`), adds the first `--limit` passages of a BEIR corpus, waits for
every document's graph to settle, and reports from `/metrics` the tokens and request seconds
per chunk, the requests by outcome, the documents whose graph failed, and the events per
chunk. Writes a sample of `--sample` events, each beside the text of its chunk, to `--out`
for checking by hand.

    scripts/graph-llm-bench.py --node http://127.0.0.1:7790 \
        --corpus ../shared/data/hotpotqa100/corpus.jsonl --limit 100 --out /tmp/g3-sample.json

Standard library only; the node must run with auth off or take `SIFT_API_KEY`.
"""

import argparse
import importlib.util
import json
import os
import random
import string
import time
import urllib.error

# The node calls and /metrics sums of scripts/graph-bench.py.
_spec = importlib.util.spec_from_file_location(
    "graph_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "graph-bench.py")
)
graph_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(graph_bench)
metric_sum = graph_bench.metric_sum


def call(node, method, path, body=None):
    """`graph_bench.call`, its answer parsed when it is JSON; None for a 404."""
    try:
        raw = graph_bench.call(node, method, path, body)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise
    return json.loads(raw) if raw.strip().startswith(("{", "[")) else raw


def metrics(node):
    return call(node, "GET", "/metrics")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", default="http://127.0.0.1:7700")
    parser.add_argument("--kb", default="graph-llm")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--sample", type=int, default=30)
    parser.add_argument("--out", default="graph-llm-sample.json")
    args = parser.parse_args()

    passages = []
    with open(args.corpus, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                passages.append(json.loads(line))
    passages = passages[: args.limit]
    call(args.node, "POST", "/v1/kbs", {"name": args.kb, "shards": 1, "graph": "llm"})
    before = metrics(args.node)
    documents = [
        {
            "external_id": passage["_id"],
            "title": passage.get("title", ""),
            "text": passage["text"],
            "metadata": {},
        }
        for passage in passages
    ]
    added = call(args.node, "POST", f"/v1/kbs/{args.kb}/documents", {"documents": documents})
    ids = [document["id"] for document in added["documents"]]
    started = time.time()
    states = {}
    while True:
        states = {}
        for document_id in ids:
            view = call(args.node, "GET", f"/v1/kbs/{args.kb}/documents/{document_id}")
            states[document_id] = view
        pending = [
            d for d, view in states.items() if view.get("graph") in (None, "pending")
        ]
        if not pending:
            break
        print(f"{len(pending)} of {len(ids)} graphs pending after {time.time() - started:.0f} s", flush=True)
        time.sleep(10)
    seconds = time.time() - started
    after = metrics(args.node)
    chunks = sum(view["chunk_count"] for view in states.values())
    delta = lambda name, label=None: metric_sum(after, name, label) - metric_sum(before, name, label)
    tokens = delta("sift_graph_llm_tokens_total")
    cached = delta("sift_graph_llm_cache_hits_total")
    asked = max(chunks - cached, 1)
    request_seconds = delta("sift_graph_llm_request_seconds_sum")
    outcomes = {
        outcome: delta("sift_graph_llm_requests_total", f'outcome="{outcome}"')
        for outcome in ("ok", "invalid_json", "schema", "timeout", "model")
    }
    failed = {d: view.get("graph_error") for d, view in states.items() if view.get("graph") == "failed"}

    # Every event: through the entities, by every first letter or digit.
    events = {}
    kinds = {}
    for first in string.ascii_lowercase + string.digits:
        listed = call(args.node, "GET", f"/v1/kbs/{args.kb}/graph/entities?q={first}&limit=100")
        for entity in (listed or {}).get("entities", []):
            kinds[entity["kind"]] = kinds.get(entity["kind"], 0) + 1
            detail = call(
                args.node, "GET", f"/v1/kbs/{args.kb}/graph/entities/{entity['id']}"
            )
            for event in (detail or {}).get("events", []):
                key = (event["chunk_id"], event["subject"], event["predicate"], event["object"])
                events[key] = event
    per_chunk = len(events) / chunks if chunks else 0.0
    print(f"documents {len(ids)}, chunks {chunks}, graphs settled in {seconds:.0f} s")
    print(f"requests by outcome: {outcomes}")
    print(f"chunks from the node's cache {cached:.0f}; asked of the model {asked:.0f}")
    print(f"tokens {tokens:.0f} ({tokens / asked:.0f} per chunk asked), model seconds "
          f"{request_seconds:.1f} ({request_seconds / asked:.2f} per chunk asked; two requests run at once)")
    print(f"graphs failed: {len(failed)} {list(failed.values())[:3]}")
    print(f"entities listed by kind: {kinds}")
    print(f"events {len(events)} ({per_chunk:.2f} per chunk)")

    texts = {}
    for document_id in ids:
        for chunk in call(args.node, "GET", f"/v1/kbs/{args.kb}/documents/{document_id}/chunks")["chunks"]:
            texts[chunk["chunk_id"]] = chunk["text"]
    chosen = sorted(events.values(), key=lambda e: (e["chunk_id"], e["subject"], e["predicate"]))
    random.Random(7).shuffle(chosen)
    sample = [dict(event, chunk_text=texts.get(event["chunk_id"], "")) for event in chosen[: args.sample]]
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(sample, out, ensure_ascii=False, indent=1)
    print(f"a sample of {len(sample)} events with their chunks: {args.out}")


if __name__ == "__main__":
    main()
