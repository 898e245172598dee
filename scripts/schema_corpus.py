"""Structured-output corpus run: every schema of tests/data/jsonschema_suite/draft2020-12.json
(343 schemas of the JSON-Schema-Test-Suite) sent as `guided_json` to a running Kiln server,
in concurrent batches that mix constrained and free requests; each finished output is
validated with Python's `jsonschema`. Prints how many compile, the reasons of those that do
not, how many finished and validated, and the wall time. With --large, also the latency of a
request with a large schema (tests/data/large_schema.json) the server has not seen, then of the
same request again (the compiled grammar cached), next to a free request's.

Usage: python3 scripts/schema_corpus.py BASE_URL [--max-tokens N] [--large] [--save FILE]
       python3 scripts/schema_corpus.py --check FILE
  e.g. kiln serve --model ../shared/models/llama-2-tiny-random.gguf, then
       python3 scripts/schema_corpus.py http://127.0.0.1:8000 --large
--save writes the raw replies (JSON) to FILE; --check validates such a file later, e.g. where
the server ran without `jsonschema` installed. Without `jsonschema` a run saves and says so.
Exits non-zero if any finished output fails to validate or the free requests disagree.
"""

import argparse
import collections
import concurrent.futures
import decimal
import json
import statistics
import sys
import time
import urllib.error
import urllib.request

CORPUS = "tests/data/jsonschema_suite/draft2020-12.json"
LARGE = "tests/data/large_schema.json"


def post(base, body):
    req = urllib.request.Request(
        base + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def valid(instance, schema):
    """jsonschema's verdict, except that `multipleOf` is checked in decimal (its float
    check calls 284.799 no multiple of 0.0001)."""
    import jsonschema

    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    for e in errors:
        if e.validator != "multipleOf":
            return str(e)[:200]
        q = decimal.Decimal(repr(e.instance)) / decimal.Decimal(repr(e.validator_value))
        if q != q.to_integral_value():
            return str(e)[:200]
    return None


def run(base, items, max_tokens):
    """Every schema (seeded sampling) plus a free greedy request every 4th, 16 at a time.
    Returns the constrained replies in corpus order, the free texts and the wall time."""

    def constrained(i, item):
        body = {"prompt": "JSON:", "max_tokens": max_tokens, "temperature": 0.7, "seed": i, "guided_json": item["schema"]}
        return post(base, body)

    def free():
        return post(base, {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0})

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futs, frees = [], []
        for i, item in enumerate(items):
            futs.append(pool.submit(constrained, i, item))
            if i % 4 == 0:
                frees.append(pool.submit(free))
        replies = [f.result() for f in futs]
        free_replies = [f.result() for f in frees]
    secs = time.perf_counter() - t0
    for status, body in free_replies:
        assert status == 200, body
    return replies, [b["choices"][0]["text"] for _, b in free_replies], secs


def report(items, replies, free_texts, secs):
    """Prints the counts and reasons; returns the exit status."""
    stats = collections.Counter()
    reasons = collections.Counter()
    invalid = []
    tokens = 0
    for item, (status, body) in zip(items, replies):
        if status != 200:
            stats["not compiled"] += 1
            reasons[body["error"]["message"].split(":")[-1].strip()[:90]] += 1
            continue
        stats["compiled"] += 1
        tokens += body["usage"]["completion_tokens"]
        choice = body["choices"][0]
        if choice["finish_reason"] != "stop":
            stats["hit max_tokens"] += 1
            continue
        stats["finished"] += 1
        try:
            err = valid(json.loads(choice["text"]), item["schema"])
        except ValueError as e:
            err = f"not JSON: {e}"
        if err is None:
            stats["validated"] += 1
        else:
            invalid.append((item["file"], item["description"], choice["text"][:200], err))
    print(f"schemas: {len(items)}")
    for k in ("compiled", "not compiled", "finished", "validated", "hit max_tokens"):
        print(f"{k}: {stats[k]}")
    print(f"free requests in the mix: {len(free_texts)}, distinct outputs {len(set(free_texts))} (greedy: 1 expected)")
    if secs is not None:
        print(f"wall time: {secs:.1f} s for {len(items) + len(free_texts)} requests, {tokens} constrained tokens")
    print("reasons for not compiling:")
    for r, n in reasons.most_common():
        print(f"  {n:3d}  {r}")
    for f, d, text, err in invalid:
        print(f"INVALID {f} / {d}: {text!r}: {err}")
    return 1 if invalid or len(set(free_texts)) != 1 else 0


def large(base, rounds=3):
    """Latency (ms, one token out) of a large schema never sent before, then cached, and free."""
    schema = json.load(open(LARGE))

    def timed(body):
        t0 = time.perf_counter()
        status, reply = post(base, dict({"prompt": "JSON:", "max_tokens": 1, "temperature": 0}, **body))
        assert status == 200, reply
        return (time.perf_counter() - t0) * 1e3

    # The server's first requests (free, then constrained) pay one-time costs of their own.
    warm = [timed({}), timed({"guided_json": {"type": "object"}})]
    firsts, cached, free = [], [], []
    for r in range(rounds):
        # A new description makes a new text: the server's grammar cache has not seen it.
        fresh = dict(schema, description=f"order, run {time.time_ns()} {r}")
        firsts.append(timed({"guided_json": fresh}))
        cached.append(timed({"guided_json": fresh}))
        free.append(timed({}))
    med = statistics.median
    print(
        f"large schema ({len(json.dumps(schema))} bytes), median of {rounds}, one token out: "
        f"first {med(firsts):.1f} ms, cached {med(cached):.1f} ms, free {med(free):.1f} ms "
        f"(firsts {[round(x, 1) for x in firsts]}; the server's first free and first constrained "
        f"requests before them: {warm[0]:.1f} ms, {warm[1]:.1f} ms)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", nargs="?", help="the server, e.g. http://127.0.0.1:8000")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--large", action="store_true", help="also time a large schema's first and cached request")
    ap.add_argument("--save", help="write the replies to this file")
    ap.add_argument("--check", help="validate the replies saved in this file (no server)")
    args = ap.parse_args()
    items = json.load(open(CORPUS))["schemas"]
    if args.check:
        saved = json.load(open(args.check))
        sys.exit(report(items, saved["replies"], saved["free_texts"], saved["secs"]))
    if not args.base:
        ap.error("BASE_URL or --check FILE")
    base = args.base.rstrip("/")
    if args.large:
        large(base)
    replies, free_texts, secs = run(base, items, args.max_tokens)
    try:
        import jsonschema  # noqa: F401

        have_validator = True
    except ImportError:
        have_validator = False
    save = args.save or (None if have_validator else "schema_corpus_replies.json")
    if save:
        json.dump({"replies": replies, "free_texts": free_texts, "secs": secs}, open(save, "w"))
        print(f"replies saved to {save}")
    if not have_validator:
        print(f"jsonschema is not installed: validate with --check {save}")
        sys.exit(0)
    sys.exit(report(items, replies, free_texts, secs))


if __name__ == "__main__":
    main()
