#!/usr/bin/env python3
"""Writes the committed seed inputs for the `constraint` fuzz target into
fuzz/corpus/constraint/: byte 0 even = a JSON Schema, odd = a Lark grammar, then the text.

Seeds: ordinary schemas (objects, arrays, anyOf/allOf, $defs with recursion, patterns,
formats), the depth bombs of issue 37 just under and over the limit, Lark grammars with
rule chains, brackets, regexes with classes, %json bodies and comments. Deterministic;
standard library only.

Usage: python3 fuzz/seed_constraint.py
"""

import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "constraint"


def ref_chain(n, wrap="anyOf"):
    defs = {}
    for i in range(n):
        ref = {"$ref": f"#/$defs/d{i + 1}"}
        defs[f"d{i}"] = {wrap: [ref, {"type": "null"}]} if wrap != "items" else {"type": "array", "items": ref}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def lark_chain(n):
    rules = "".join(f'r{i}: "x" r{i + 1}\n' for i in range(n))
    return f'start: r0\n{rules}r{n}: "end"\n'


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "pattern": "^[a-z]{2,5}$"}}, "required": ["a"]},
    {"type": "array", "items": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}, "minItems": 1, "maxItems": 4},
    {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"},
    {"allOf": [{"type": "object"}, {"properties": {"x": {"enum": ["a", "b", 1, None]}}}]},
    {"type": "string", "format": "date-time"},
    ref_chain(40),
    ref_chain(80, "allOf"),
    ref_chain(60, "items"),
    ref_chain(300),
]

LARKS = [
    'start: expr\nexpr: term ("+" term)*\nterm: NUMBER | "(" expr ")"\nNUMBER: /[0-9]+/\n',
    'start: "a" /[/]x/ b\nb: "c" // comment: d\n',
    'start: %json {"type": "object", "properties": {"k": {"type": "integer"}}}\n',
    'start: ((("a" | "b")+ "c")? ["d"])\n',
    "start: W\nW: " + " | ".join(f'"w{i}"' for i in range(50)) + "\n",
    lark_chain(120),
    lark_chain(700),
    "start: " + "(" * 300 + '"a"' + ")" * 300 + "\n",
]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(SCHEMAS):
        (OUT / f"seed-json-{i:02}").write_bytes(b"\x00" + json.dumps(s).encode())
    for i, g in enumerate(LARKS):
        (OUT / f"seed-lark-{i:02}").write_bytes(b"\x01" + g.encode())


if __name__ == "__main__":
    main()
