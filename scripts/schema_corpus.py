"""Structured-output corpus run: every schema of tests/data/jsonschema_suite/draft2020-12.json
(343 schemas of the JSON-Schema-Test-Suite) sent as `guided_json` to a running Kiln server,
in concurrent batches that mix constrained and free requests; each finished output is
validated with Python's `jsonschema`. Prints how many compile, the reasons of those that do
not, how many finished and validated.

Usage: python3 scripts/schema_corpus.py BASE_URL [MAX_TOKENS]
  e.g. kiln serve --model ../shared/models/llama-2-tiny-random.gguf, then
       python3 scripts/schema_corpus.py http://127.0.0.1:8000
Exits non-zero if any finished output fails to validate.
"""

import collections
import concurrent.futures
import decimal
import json
import sys
import urllib.error
import urllib.request

import jsonschema

BASE = sys.argv[1].rstrip("/")
MAX_TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 256
CORPUS = "tests/data/jsonschema_suite/draft2020-12.json"


def post(body):
    req = urllib.request.Request(
        BASE + "/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def valid(instance, schema):
    """jsonschema's verdict, except that `multipleOf` is checked in decimal (its float
    check calls 284.799 no multiple of 0.0001)."""
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(instance))
    for e in errors:
        if e.validator != "multipleOf":
            return str(e)[:200]
        q = decimal.Decimal(repr(e.instance)) / decimal.Decimal(repr(e.validator_value))
        if q != q.to_integral_value():
            return str(e)[:200]
    return None


def run_one(item, i):
    body = {"prompt": "JSON:", "max_tokens": MAX_TOKENS, "temperature": 0.7, "seed": i, "guided_json": item["schema"]}
    return post(body)


def run_free(i):
    return post({"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0})


def main():
    items = json.load(open(CORPUS))["schemas"]
    stats = collections.Counter()
    reasons = collections.Counter()
    invalid = []
    free_texts = set()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futs = []
        for i, item in enumerate(items):
            futs.append(("c", item, pool.submit(run_one, item, i)))
            if i % 4 == 0:
                futs.append(("f", None, pool.submit(run_free, i)))
        for kind, item, fut in futs:
            status, body = fut.result()
            if kind == "f":
                assert status == 200, body
                free_texts.add(body["choices"][0]["text"])
                continue
            if status != 200:
                stats["not compiled"] += 1
                msg = body["error"]["message"]
                reasons[msg.split(":")[-1].strip()[:90]] += 1
                continue
            stats["compiled"] += 1
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
    print(f"free requests in the mix: {sum(1 for k, _, _ in futs if k == 'f')}, distinct outputs {len(free_texts)} (greedy: 1 expected)")
    print("reasons for not compiling:")
    for r, n in reasons.most_common():
        print(f"  {n:3d}  {r}")
    for f, d, text, err in invalid:
        print(f"INVALID {f} / {d}: {text!r}: {err}")
    sys.exit(1 if invalid or len(free_texts) != 1 else 0)


if __name__ == "__main__":
    main()
