#!/usr/bin/env python3
"""Ten SciFact questions end to end through a running node and a real model.

Loads a slice of a BEIR collection (the judged documents of the first QUESTIONS test queries,
then other documents up to --docs) into a KB, asks each question in a fresh session, reads the
SSE stream and reports per question: wall time, tool calls made, the answer mode (agent or a
fallback), citations, and how many cited documents are judged relevant. Python standard
library only.

The node must use the model, e.g. with ../shared/tools/real-llm.sh running on port 8089:
  SIFT_LLM_BASE_URL=http://127.0.0.1:8089/v1 SIFT_LLM_MODEL=local \
  SIFT_LLM_TOOL_MODE=json_schema SIFT_LLM_CONTEXT_WINDOW=8192 sift serve --data-dir /tmp/real
Usage: scripts/real-model-run.py DATASET_DIR [--node URL] [--questions 10] [--docs 300]
"""
import argparse
import json
import sys
import time
import os
import urllib.request

# The node's API key (SIFT_API_KEY), sent as a bearer token when set.
AUTH = {"authorization": "Bearer " + os.environ["SIFT_API_KEY"]} if os.environ.get("SIFT_API_KEY") else {}


def call(node, method, path, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(node + path, data=data, method=method,
                                     headers={"content-type": "application/json", **AUTH})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ask(node, kb, question, timeout):
    """One turn: returns the events of its stream, as (name, data) pairs, and the wall time."""
    session = call(node, "POST", "/v1/sessions", {"kbs": [kb]})
    started = time.time()
    request = urllib.request.Request(
        f"{node}/v1/sessions/{session['id']}/messages",
        data=json.dumps({"content": question}).encode(), method="POST",
        headers={"content-type": "application/json", "accept": "text/event-stream", **AUTH})
    events, name, data = [], None, []
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode("utf-8").rstrip("\n")
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif line == "" and name:
                try:
                    payload = json.loads("\n".join(data)) if data else {}
                except ValueError:
                    payload = {"raw": "\n".join(data)}
                events.append((name, payload))
                if name == "done":
                    break
                name, data = None, []
    turns = call(node, "GET", f"/v1/sessions/{session['id']}/messages")
    return events, time.time() - started, turns


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("--node", default="http://127.0.0.1:7700")
    parser.add_argument("--kb", default="scifact-real")
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", default="/tmp/real-model-run.json")
    args = parser.parse_args()

    qrels = {}
    with open(f"{args.dataset}/qrels/test.tsv") as f:
        for line in f:
            parts = line.split("\t")
            if len(parts) >= 3 and parts[0] != "query-id" and int(parts[2]) > 0:
                qrels.setdefault(parts[0], set()).add(parts[1])
    queries = [q for q in read_jsonl(f"{args.dataset}/queries.jsonl") if q["_id"] in qrels]
    queries = queries[: args.questions]
    judged = set().union(*(qrels[q["_id"]] for q in queries))
    corpus = read_jsonl(f"{args.dataset}/corpus.jsonl")
    chosen = [d for d in corpus if d["_id"] in judged]
    chosen += [d for d in corpus if d["_id"] not in judged][: max(0, args.docs - len(chosen))]

    kbs = call(args.node, "GET", "/v1/kbs")
    names = [kb["name"] for kb in (kbs.get("kbs", kbs) if isinstance(kbs, dict) else kbs)]
    if args.kb not in names:
        call(args.node, "POST", "/v1/kbs", {"name": args.kb, "shards": 2})
        for start in range(0, len(chosen), 200):
            documents = [{"external_id": d["_id"], "title": d.get("title", ""), "text": d["text"]}
                         for d in chosen[start:start + 200]]
            call(args.node, "POST", f"/v1/kbs/{args.kb}/documents", {"documents": documents})
    while True:
        kb = call(args.node, "GET", f"/v1/kbs/{args.kb}")
        counts = kb.get("documents", {})
        if counts.get("ready", 0) + counts.get("failed", 0) >= len(chosen):
            break
        time.sleep(1)
    print(f"kb {args.kb}: {counts.get('ready')} ready documents ({len(judged)} judged for "
          f"{len(queries)} questions)", flush=True)

    results = []
    for query in queries:
        events, seconds, turns = ask(args.node, args.kb, query["text"], args.timeout)
        tools = [data.get("name") for name, data in events if name == "tool_call"]
        cited = [data.get("external_id") for name, data in events if name == "citation"]
        errors = [data for name, data in events if name == "error"]
        done = next((data for name, data in events if name == "done"), {})
        stored = (turns.get("messages") or turns.get("turns") or [{}])[-1] if isinstance(turns, dict) else {}
        relevant = qrels[query["_id"]]
        answer = "".join(data.get("text", "") for name, data in events if name == "delta")
        result = {
            "query_id": query["_id"],
            "question": query["text"],
            "seconds": round(seconds, 1),
            "tool_calls": tools,
            "finish_reason": done.get("finish_reason"),
            "mode": stored.get("mode"),
            "citations": cited,
            "cited_relevant": sorted({c for c in cited if c in relevant}),
            "relevant": sorted(relevant),
            "errors": errors,
            "answer": answer,
        }
        results.append(result)
        print(f"{query['_id']:>5} {seconds:6.1f}s tools={len(tools)} {','.join(t or '?' for t in tools)[:60]:<60} "
              f"mode={result['mode']} cites={len(cited)} relevant={len(result['cited_relevant'])}/{len(relevant)} "
              f"finish={result['finish_reason']}", flush=True)

    answered = [r for r in results if r["citations"]]
    hit = [r for r in results if r["cited_relevant"]]
    seconds = sorted(r["seconds"] for r in results)
    print(f"\n{len(results)} questions: {len(answered)} answered with citations, "
          f"{len(hit)} cite at least one judged-relevant document; "
          f"wall per answer p50 {seconds[len(seconds) // 2]:.1f}s, max {seconds[-1]:.1f}s; "
          f"tool calls per question {sum(len(r['tool_calls']) for r in results) / max(1, len(results)):.1f}; "
          f"modes {sorted({str(r['mode']) for r in results})}")
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"details in {args.json}")


if __name__ == "__main__":
    sys.exit(main())
