#!/usr/bin/env python3
"""The graph channel's cost on a KB that `sift-bench quality` filled (ADR 0037, run G1).

Searches every query of a BEIR dataset with the graph channel alone (no rerank, no links)
and reports the node's own `timings.graph_ms` (all the channel's rounds, the HTTP hop
excluded) as p50/p99, how many queries found a seed, and, from `/metrics`, the extraction
cost per chunk and the graph's size on this node.

    scripts/graph-bench.py --node http://127.0.0.1:7790 --kb hotpotqa \
        --queries ../shared/data/hotpotqa100/queries.jsonl

Standard library only; the node must run with auth off or take `SIFT_API_KEY`.
"""

import argparse
import json
import os
import statistics
import urllib.request


def call(node, method, path, body=None):
    request = urllib.request.Request(
        node.rstrip("/") + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    key = os.environ.get("SIFT_API_KEY")
    if key:
        request.add_header("authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=60) as answer:
        raw = answer.read()
    return raw.decode()


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def metric_sum(text, name, kb=None):
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head != name and not head.startswith(name + "{"):
            continue
        if kb is not None and f'kb="{kb}"' not in head:
            continue
        total += float(value)
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", default="http://127.0.0.1:7700")
    parser.add_argument("--kb", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--max-queries", type=int, default=1000)
    args = parser.parse_args()

    queries = []
    with open(args.queries, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                queries.append(json.loads(line)["text"])
    queries = queries[: args.max_queries]
    graph_ms, hits = [], 0
    for query in queries:
        answer = json.loads(
            call(
                args.node,
                "POST",
                f"/v1/kbs/{args.kb}/search",
                {
                    "query": query,
                    "channels": ["graph"],
                    "rerank": False,
                    "follow_links": False,
                    "top_k": 10,
                },
            )
        )
        graph_ms.append(answer["timings"]["graph_ms"])
        hits += bool(answer["hits"])
    metrics = call(args.node, "GET", "/metrics")
    kb = json.loads(call(args.node, "GET", f"/v1/kbs/{args.kb}"))
    chunks = metric_sum(metrics, "sift_graph_extracted_chunks_total")
    seconds = metric_sum(metrics, "sift_graph_extraction_seconds_sum")
    entities = metric_sum(metrics, "sift_graph_entities", kb["name"])
    mentions = metric_sum(metrics, "sift_graph_mentions", kb["name"])
    edges = metric_sum(metrics, "sift_graph_edges", kb["name"])
    print(f"graph-bench: {len(queries)} queries on kb {args.kb} at {args.node}")
    print(
        f"graph channel (node's timings.graph_ms): p50 {statistics.median(graph_ms):.2f} ms, "
        f"p99 {percentile(graph_ms, 0.99):.2f} ms; {hits}/{len(queries)} queries with graph hits"
    )
    if chunks:
        print(
            f"extraction on this node since start: {chunks:.0f} chunks in {seconds:.2f} s "
            f"= {1e3 * seconds / chunks:.3f} ms per chunk (extract and store)"
        )
    print(
        f"graph of {args.kb} on this node: {entities:.0f} entities, {mentions:.0f} mentions, "
        f"{edges:.0f} co-occurring pairs"
    )


if __name__ == "__main__":
    main()
