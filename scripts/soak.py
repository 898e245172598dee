#!/usr/bin/env python3
"""Soak test for a running Kiln server (issue 14): many concurrent mixed clients for a
while, some of them dropping mid-stream, then one large burst; the server's resident
memory is sampled on a fixed period and written as CSV and an SVG plot.

Standard library only (asyncio sockets, HTTP/1.1), so it runs wherever Python 3 does.

    kiln serve --port 8000 &
    python3 scripts/soak.py --pid $! --clients 200 --duration 300 --drop 0.1 --burst 2000

Prints a summary line per sample and a final table; exits 1 when any request failed
(an HTTP status other than 200/429, a broken stream, or a 429 without Retry-After).
"""

import argparse
import asyncio
import json
import os
import random
import time

PROMPTS = [
    "Once upon a time",
    "The little dog",
    "Lily and Tom went to the park",
    "One day, a big bird",
    "There was a girl named Sue who",
]


class Stats:
    def __init__(self):
        self.ok = 0
        self.dropped = 0
        self.busy = 0
        self.errors = []

    def error(self, what):
        if len(self.errors) < 20:
            self.errors.append(what)
        else:
            self.errors.append("...")
            self.errors = self.errors[:21]


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return float("nan")
    return float("nan")


async def request(host, port, path, body, key, drop_after=None):
    """POSTs `body`; returns (status, headers, frames read). With `drop_after`, closes the
    socket after that many SSE frames."""
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n"
    )
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    writer.write(head.encode() + b"\r\n" + data)
    await writer.drain()
    try:
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        frames = 0
        done = False
        while True:
            line = await reader.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                frames += 1
                if line.strip() == b"data: [DONE]":
                    done = True
                if drop_after is not None and frames >= drop_after:
                    return status, headers, frames, None
        return status, headers, frames, done
    finally:
        writer.close()


async def client(args, stats, stop_at, rng):
    while time.monotonic() < stop_at:
        body = {
            "model": args.model,
            "prompt": rng.choice(PROMPTS),
            "max_tokens": rng.randint(8, args.max_tokens),
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "stream": rng.random() < 0.7,
        }
        if rng.random() < 0.3:
            body["n"] = rng.randint(2, 4)
        drop = body["stream"] and rng.random() < args.drop
        try:
            status, headers, frames, done = await request(
                args.host, args.port, "/v1/completions", body, args.api_key,
                drop_after=rng.randint(1, 4) if drop else None,
            )
        except (OSError, ValueError, IndexError) as e:
            stats.error(f"connection: {e!r}")
            continue
        if status == 429:
            stats.busy += 1
            if "retry-after" not in headers:
                stats.error("429 without Retry-After")
            await asyncio.sleep(float(headers.get("retry-after", "1")))
        elif status != 200:
            stats.error(f"HTTP {status}")
        elif drop:
            stats.dropped += 1
        elif body["stream"] and not done:
            stats.error(f"stream ended without [DONE] after {frames} frames")
        else:
            stats.ok += 1


async def sampler(args, samples, stop_at, stats):
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        mb = rss_mb(args.pid) if args.pid else float("nan")
        samples.append((now - t0, mb))
        print(f"t={now - t0:6.0f}s rss={mb:8.1f} MB ok={stats.ok} dropped={stats.dropped} "
              f"429={stats.busy} errors={len(stats.errors)}", flush=True)
        if now >= stop_at:
            return
        await asyncio.sleep(min(args.sample_s, max(stop_at - now, 0.01)))


async def burst(args, n):
    """`n` clients at once, one short non-streamed request each: counts of statuses."""
    sem = asyncio.Semaphore(1000)  # stay below the client's own descriptor limit

    async def one(i):
        async with sem:
            body = {"model": args.model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 4}
            try:
                status, headers, _, _ = await request(args.host, args.port, "/v1/completions",
                                                      body, args.api_key)
                if status == 429 and "retry-after" not in headers:
                    return "429-no-retry-after"
                return str(status)
            except (OSError, ValueError, IndexError) as e:
                return f"error {type(e).__name__}"

    results = await asyncio.gather(*(one(i) for i in range(n)))
    counts = {}
    for r in results:
        counts[r] = counts.get(r, 0) + 1
    return counts


def svg_plot(samples, path):
    pts = [(t, m) for t, m in samples if m == m]
    if len(pts) < 2:
        return
    w, h, pad = 640, 320, 48
    tmax = max(t for t, _ in pts) or 1
    mmax = max(m for _, m in pts) * 1.1 or 1
    xy = " ".join(f"{pad + t / tmax * (w - 2 * pad):.1f},{h - pad - m / mmax * (h - 2 * pad):.1f}"
                  for t, m in pts)
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
                f'<rect width="{w}" height="{h}" fill="white"/>'
                f'<polyline fill="none" stroke="#c0392b" stroke-width="2" points="{xy}"/>'
                f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>'
                f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>'
                f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">seconds (0-{tmax:.0f})</text>'
                f'<text x="12" y="{pad - 12}">RSS MB (max {mmax / 1.1:.0f})</text></svg>')


async def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=None)
    p.add_argument("--api-key", default=os.environ.get("KILN_API_KEY"))
    p.add_argument("--pid", type=int, help="server process to sample RSS of")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--duration", type=float, default=300)
    p.add_argument("--drop", type=float, default=0.1, help="share of streams dropped early")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--sample-s", type=float, default=15)
    p.add_argument("--burst", type=int, default=2000)
    p.add_argument("--out", default="soak", help="prefix of the CSV and SVG written")
    args = p.parse_args()
    stats, samples = Stats(), []
    stop_at = time.monotonic() + args.duration
    rng = random.Random(7)
    tasks = [client(args, stats, stop_at, random.Random(rng.random()))
             for _ in range(args.clients)]
    await asyncio.gather(sampler(args, samples, stop_at, stats), *tasks)
    counts = await burst(args, args.burst) if args.burst else {}
    after = rss_mb(args.pid) if args.pid else float("nan")
    with open(f"{args.out}.csv", "w") as f:
        f.write("seconds,rss_mb\n")
        for t, m in samples:
            f.write(f"{t:.1f},{m:.1f}\n")
    svg_plot(samples, f"{args.out}.svg")
    print(f"\nsoak: {args.clients} clients for {args.duration:.0f} s: {stats.ok} completed, "
          f"{stats.dropped} dropped on purpose, {stats.busy} answered 429, "
          f"{len(stats.errors)} errors")
    for e in stats.errors:
        print("  error:", e)
    print(f"burst of {args.burst}: {counts}; rss after {after:.1f} MB")
    print(f"wrote {args.out}.csv and {args.out}.svg")
    bad = [k for k in counts if k not in ("200", "429")]
    return 1 if stats.errors or bad else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
