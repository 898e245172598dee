#!/usr/bin/env python3
"""openai-harmony as the reference for Kiln's harmony rendering and parsing (tests/api_harmony.rs).

    TIKTOKEN_ENCODINGS_BASE=DIR python3 tests/harmony_ref.py render < conversations.json
    TIKTOKEN_ENCODINGS_BASE=DIR python3 tests/harmony_ref.py parse < replies.json

DIR holds o200k_base.tiktoken (scripts/o200k_files.py DIR --only tiktoken writes it).

render: each conversation `{"date", "effort", "instructions", "tools": [{"name",
"description", "parameters"}], "messages": [{"role", "content", "channel", "recipient",
"content_type"}]}` (a `tool` message names its function in `name`) becomes harmony's prompt
for the assistant's next turn: `{"text"}`, the decoded tokens.

parse: each reply, a list of assistant messages `{"channel", "recipient", "content_type",
"content"}`, becomes the tokens the model would write after the prompt's `<|start|>assistant`
(harmony renders every message; the first loses its `<|start|>assistant`, the last ends with
`<|call|>` when it has a recipient, else `<|return|>`) and harmony's parse of those tokens:
`{"tokens", "messages": [{"channel", "recipient", "text"}]}`. A reply given as a string is
encoded as it stands (special tokens included).

Prints one JSON list, in input order.
"""

from __future__ import annotations

import json
import sys

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncodingName,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    load_harmony_encoding,
)

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}


def message(m: dict) -> Message:
    role = Role(m["role"])
    if role == Role.TOOL:
        msg = Message.from_author_and_content(Author.new(Role.TOOL, m["name"]), m["content"])
        msg = msg.with_recipient("assistant")
    else:
        msg = Message.from_role_and_content(role, m["content"])
        if m.get("recipient"):
            msg = msg.with_recipient(m["recipient"])
    if m.get("channel"):
        msg = msg.with_channel(m["channel"])
    if m.get("content_type"):
        msg = msg.with_content_type(m["content_type"])
    return msg


def render(enc, case: dict) -> dict:
    system = SystemContent.new().with_conversation_start_date(case["date"])
    system = system.with_reasoning_effort(EFFORTS[case.get("effort") or "medium"])
    msgs = [Message.from_role_and_content(Role.SYSTEM, system)]
    tools = [
        ToolDescription.new(t["name"], t.get("description") or "", parameters=t.get("parameters"))
        for t in case.get("tools") or []
    ]
    if case.get("instructions") or tools:
        dev = DeveloperContent.new()
        if case.get("instructions"):
            dev = dev.with_instructions(case["instructions"])
        if tools:
            dev = dev.with_function_tools(tools)
        msgs.append(Message.from_role_and_content(Role.DEVELOPER, dev))
    msgs.extend(message(m) for m in case["messages"])
    tokens = enc.render_conversation_for_completion(Conversation.from_messages(msgs), Role.ASSISTANT)
    return {"text": enc.decode_utf8(tokens)}


def parse(enc, reply: list | str) -> dict:
    head = enc.encode("<|start|>assistant", allowed_special="all")
    end_ids = set(enc.encode("<|end|><|return|><|call|>", allowed_special="all"))
    tokens: list[int] = []
    if isinstance(reply, str):
        # A reply written out as text, as gpt-oss writes it.
        tokens = enc.encode(reply, allowed_special="all")
        reply = []
    for i, m in enumerate(reply):
        t = enc.render(message({"role": "assistant", **m}))
        if i == 0:
            assert t[: len(head)] == head, t
            t = t[len(head) :]
        if i == len(reply) - 1:
            assert t[-1] in end_ids, t
            t = t[:-1] + enc.encode("<|call|>" if m.get("recipient") else "<|return|>", allowed_special="all")
        tokens.extend(t)
    parsed = enc.parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    messages = [
        {
            "channel": p.channel,
            "recipient": p.recipient,
            "text": "".join(c.text for c in p.content),
        }
        for p in parsed
    ]
    return {"tokens": tokens, "messages": messages}


def main() -> None:
    command = sys.argv[1]
    cases = json.load(sys.stdin)
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    run = {"render": render, "parse": parse}[command]
    json.dump([run(enc, c) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
