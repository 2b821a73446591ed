#!/usr/bin/env python3
"""Idle and slow-header sockets against a running node, with /healthz latency meanwhile.

Opens IDLE sockets that never send a byte and SLOW sockets that send a request's headers a
byte at a time, all from 127.0.0.1; then times /healthz from 127.0.0.2 (another client
address, so the per-address cap does not apply to it) while they are held, and again once
they are gone. Reports how many sockets the node kept open and how many it closed.
Traffic goes to loopback only.

With --pid, also counts the node's open file descriptors (sockets the client thinks open may
still sit in the kernel's accept queue; the node's descriptors are what it holds).

Usage: scripts/connection-flood.py [--port 7700] [--pid PID] [--idle 1500] [--slow 200] [--hold 5]
"""

import os

import argparse
import asyncio
import statistics
import time


async def idle_socket(port, results):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        results["refused_connect"] += 1
        return None
    return reader, writer


async def slow_socket(port, results, stop):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        results["refused_connect"] += 1
        return
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096
    for byte in request:
        if stop.is_set() or reader.at_eof():
            break
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except OSError:
            break
        await asyncio.sleep(0.5)
    results["slow_closed_by_server"] += int(reader.at_eof() or writer.is_closing())
    writer.close()


async def healthz(port, count):
    latencies = []
    failures = 0
    for _ in range(count):
        started = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)), 5
            )
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 5)
            await reader.read()
            writer.close()
            if b" 200 " not in status:
                failures += 1
                continue
        except (OSError, asyncio.TimeoutError):
            failures += 1
            continue
        latencies.append((time.perf_counter() - started) * 1e3)
    return latencies, failures


def summary(latencies):
    if not latencies:
        return "no answers"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):.2f} ms, p99 {p99:.2f} ms"


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=7700)
    parser.add_argument("--idle", type=int, default=1500)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--pid", type=int)
    args = parser.parse_args()

    def descriptors():
        return len(os.listdir(f"/proc/{args.pid}/fd")) if args.pid else None

    print(f"node file descriptors before: {descriptors()}")

    baseline, baseline_failures = await healthz(args.port, args.probes)
    print(f"/healthz with no flood: {summary(baseline)}, {baseline_failures} failed")

    results = {"refused_connect": 0, "slow_closed_by_server": 0}
    idle = [s for s in await asyncio.gather(*(idle_socket(args.port, results) for _ in range(args.idle))) if s]
    stop = asyncio.Event()
    slow = [asyncio.create_task(slow_socket(args.port, results, stop)) for _ in range(args.slow)]
    await asyncio.sleep(args.hold)
    during, during_failures = await healthz(args.port, args.probes)
    kept = 0
    for reader, _ in idle:
        # A socket the node closed reads EOF at once.
        try:
            data = await asyncio.wait_for(reader.read(1), 0.01)
            kept += int(data != b"")
        except asyncio.TimeoutError:
            kept += 1
    print(f"idle sockets opened {len(idle)}, still open after {args.hold:.0f} s: {kept}")
    print(f"/healthz during the flood: {summary(during)}, {during_failures} failed")
    print(f"node file descriptors during the flood: {descriptors()}")
    stop.set()
    await asyncio.gather(*slow)
    print(
        f"slow-header sockets {args.slow}, closed by the node before their headers ended: "
        f"{results['slow_closed_by_server']}"
    )
    for _, writer in idle:
        writer.close()


if __name__ == "__main__":
    asyncio.run(main())
