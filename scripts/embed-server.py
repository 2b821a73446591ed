#!/usr/bin/env python3
"""A stand-in external embedding server for benchmarks: the OpenAI `/v1/embeddings` wire
format, deterministic unit vectors from a hash of each text, and an optional fixed delay per
request. It holds the embedding cost fixed (and small) so that an ingestion benchmark measures
Sift's own pipeline as nodes are added. Not a model: rankings built on it are meaningless.

Usage: scripts/embed-server.py [--listen 127.0.0.1:7790] [--dimension 384] [--delay-ms 0]
"""
import argparse
import hashlib
import json
import math
import struct
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def vector(text, dimension):
    values = []
    counter = 0
    while len(values) < dimension:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        values.extend(v / 2**31 for v in struct.unpack("<8i", digest))
        counter += 1
    values = values[:dimension]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", default="127.0.0.1:7790")
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    served = {"requests": 0, "texts": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.reply(200, {"served": served})

        def do_POST(self):
            if not self.path.rstrip("/").endswith("/embeddings"):
                return self.reply(404, {"error": {"message": "not found"}})
            length = int(self.headers.get("content-length", "0"))
            try:
                request = json.loads(self.rfile.read(length))
                texts = request["input"]
                texts = [texts] if isinstance(texts, str) else list(texts)
            except (ValueError, KeyError, TypeError) as error:
                return self.reply(400, {"error": {"message": f"bad request: {error}"}})
            if args.delay_ms:
                time.sleep(args.delay_ms / 1000)
            served["requests"] += 1
            served["texts"] += len(texts)
            data = [
                {"object": "embedding", "index": i, "embedding": vector(t, args.dimension)}
                for i, t in enumerate(texts)
            ]
            tokens = sum(len(t.split()) for t in texts)
            self.reply(200, {
                "object": "list",
                "data": data,
                "model": request.get("model", "hash"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            })

    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
