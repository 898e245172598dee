"""Kiln against the real `anthropic` Python SDK (its Messages API).

Usage: python3 tests/anthropic_sdk.py BASE_URL API_KEY MODEL [SUITE [LOGIT_BIAS]]
(run by tests/api_anthropic_sdk.rs against in-process servers). SUITE `test` runs the
`test_*` checks (messages.create, messages.stream, stop sequences, count_tokens, auth and the
error classes, on stories260K); `markup` runs the `markup_*` ones (tools with a tool_result
round trip and thinking, on the random Llama-2 whose `<tool_call>` and `<think>` are special
tokens; LOGIT_BIAS as JSON, sent through `extra_body`). Prints one line per check and
'N passed, N failed'; exits non-zero on any failure.
"""

import json
import sys
import traceback

import anthropic
from anthropic import Anthropic

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
SUITE = sys.argv[4] if len(sys.argv) > 4 else "test"
client = Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=60)
SYSTEM = "You tell short stories."
MESSAGES = [{"role": "user", "content": "Tell me about a cat."}]
# This SDK has no `temperature` argument; Kiln takes it (0 to 1) from the body.
GREEDY = {"temperature": 0}


def expect(exc, fn):
    try:
        fn()
    except exc as e:
        return e
    raise AssertionError(f"expected {exc.__name__}")


def dump(blocks):
    return [b.model_dump(exclude_none=True) for b in blocks]


def test_create():
    msg = client.messages.create(model=MODEL, max_tokens=32, system=SYSTEM, extra_body=GREEDY,
                                 messages=MESSAGES, metadata={"user_id": "u-1"})
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_"), msg
    assert msg.model == MODEL, msg
    [block] = msg.content
    assert block.type == "text" and block.text, msg
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None, msg
    prompt = msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    assert msg.usage.output_tokens > 0 and prompt > 5, msg.usage


def test_stream_adds_up_to_create():
    kw = dict(model=MODEL, max_tokens=32, messages=MESSAGES, extra_body=GREEDY,
              system=[{"type": "text", "text": SYSTEM}])
    msg = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text, (text, msg.content[0].text)
    assert dump(final.content) == dump(msg.content), (final, msg)
    assert (final.stop_reason, final.stop_sequence) == (msg.stop_reason, msg.stop_sequence)
    assert final.usage.output_tokens == msg.usage.output_tokens, (final.usage, msg.usage)
    kinds = [e.type for e in client.messages.create(stream=True, **kw)]
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) == {"content_block_delta"}, kinds


def test_stop_sequences():
    full = client.messages.create(model=MODEL, max_tokens=32, messages=MESSAGES, extra_body=GREEDY)
    text = full.content[0].text
    word = text.split()[2]
    msg = client.messages.create(model=MODEL, max_tokens=32, messages=MESSAGES, extra_body=GREEDY,
                                 stop_sequences=[word, "never-in-a-story"])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", word), msg
    cut = msg.content[0].text if msg.content else ""
    assert text.startswith(cut) and word not in cut, (cut, text)
    short = client.messages.create(model=MODEL, max_tokens=2, messages=MESSAGES)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2, short


def test_count_tokens():
    kw = dict(model=MODEL, system=SYSTEM, messages=MESSAGES)
    counted = client.messages.count_tokens(**kw).input_tokens
    msg = client.messages.create(max_tokens=2, **kw)
    assert counted == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0), (counted, msg.usage)
    assert counted > client.messages.count_tokens(model=MODEL, messages=MESSAGES).input_tokens


def test_x_api_key_and_bearer_auth():
    by_header = Anthropic(base_url=BASE, api_key=None, auth_token=None, max_retries=0,
                          default_headers={"x-api-key": KEY})
    msg = by_header.messages.create(model=MODEL, max_tokens=2, messages=MESSAGES)
    assert msg.type == "message", msg
    for bad in (Anthropic(base_url=BASE, api_key="sk-wrong", max_retries=0),
                Anthropic(base_url=BASE, api_key=None, auth_token=None, max_retries=0,
                          default_headers={"x-api-key": "sk-wrong"})):
        e = expect(anthropic.AuthenticationError,
                   lambda: bad.messages.create(model=MODEL, max_tokens=2, messages=MESSAGES))
        assert e.status_code == 401 and e.body["type"] == "error", e.body
        assert e.body["error"]["type"] == "authentication_error", e.body


def test_error_classes():
    image = [{"role": "user", "content": [
        {"type": "text", "text": "What is in it?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]
    for stream in (False, True):
        e = expect(anthropic.BadRequestError,
                   lambda: client.messages.create(model=MODEL, max_tokens=4, messages=image, stream=stream))
        assert e.body["error"]["type"] == "invalid_request_error" and "image" in e.body["error"]["message"], e.body
    e = expect(anthropic.BadRequestError,
               lambda: client.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": MESSAGES}))
    assert "max_tokens" in e.body["error"]["message"], e.body
    e = expect(anthropic.NotFoundError,
               lambda: client.messages.create(model="claude-nope", max_tokens=4, messages=MESSAGES))
    assert e.body["error"]["type"] == "not_found_error" and "claude-nope" in e.body["error"]["message"], e.body
    e = expect(anthropic.BadRequestError,
               lambda: client.messages.count_tokens(model=MODEL, messages=image))
    assert "image" in e.body["error"]["message"], e.body
    assert client.messages.create(model=MODEL, max_tokens=2, messages=MESSAGES).type == "message"


WEATHER = [{"name": "get_weather", "description": "The weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                             "required": ["city"], "additionalProperties": False}}]
QUESTION = {"role": "user", "content": "Weather in Paris?"}


def markup_tool_use_and_tool_result_round_trip():
    """A forced call (the tool grammar holds the random model to the schema), streamed and
    not, then the call and its result sent back."""
    kw = dict(model=MODEL, max_tokens=120, messages=[QUESTION], tools=WEATHER, extra_body=GREEDY,
              tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    msg = client.messages.create(**kw)
    assert msg.stop_reason == "tool_use", msg
    [call] = [b for b in msg.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_"), call
    assert set(call.input) == {"city"} and len(call.input["city"]) <= 12, call.input
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert (streamed.name, streamed.input, final.stop_reason) == (call.name, call.input, "tool_use"), final
    any_call = client.messages.create(**{**kw, "tool_choice": {"type": "any"}})
    assert any_call.stop_reason == "tool_use", any_call

    def turns(result):
        return [QUESTION, {"role": "assistant", "content": msg.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": result}]}]

    follow = client.messages.create(model=MODEL, max_tokens=8, tools=WEATHER, extra_body=GREEDY,
                                    messages=turns([{"type": "text", "text": "Sunny, 21 C"}]))
    assert follow.type == "message", follow
    counted = client.messages.count_tokens(model=MODEL, tools=WEATHER, messages=turns("Sunny, 21 C")).input_tokens
    empty = client.messages.count_tokens(model=MODEL, tools=WEATHER, messages=turns("")).input_tokens
    assert counted == follow.usage.input_tokens + (follow.usage.cache_read_input_tokens or 0), (counted, follow.usage)
    assert counted > empty, "the tool result reaches the prompt"


def markup_thinking():
    """`thinking` enabled: the reasoning parser's text comes back as a signed thinking block.
    argv[5]: a logit bias under which the random model thinks a few tokens, then closes
    `</think>`; the forced call follows."""
    plain = client.messages.create(model=MODEL, max_tokens=12, messages=[QUESTION], extra_body=GREEDY,
                                   thinking={"type": "enabled", "budget_tokens": 8})
    assert plain.content[0].type == "thinking" and plain.content[0].thinking, plain
    assert plain.content[0].signature and plain.stop_reason == "max_tokens", plain
    bias = json.loads(sys.argv[5])
    kw = dict(model=MODEL, max_tokens=80, messages=[QUESTION], tools=WEATHER,
              tool_choice={"type": "any"}, thinking={"type": "enabled", "budget_tokens": 40},
              extra_body={"temperature": 0, "logit_bias": bias, "frequency_penalty": 2.0, "presence_penalty": 2.0})
    msg = client.messages.create(**kw)
    assert [b.type for b in msg.content] == ["thinking", "tool_use"], msg
    assert msg.content[0].thinking and msg.content[0].signature and msg.stop_reason == "tool_use", msg
    kinds = set()
    with client.messages.stream(**kw) as stream:
        for event in stream:
            kinds.add(event.type)
        final = stream.get_final_message()
    assert {"thinking", "signature", "input_json"} <= kinds, kinds
    thought, streamed = final.content[0], final.content[1]
    assert (thought.thinking, thought.signature) == (msg.content[0].thinking, msg.content[0].signature), final
    assert (streamed.name, streamed.input) == (msg.content[1].name, msg.content[1].input), final


def main():
    prefix = {"markup": "markup_"}.get(SUITE, "test_")
    tests = [(n, f) for n, f in globals().items() if n.startswith(prefix) and callable(f)]
    passed = failed = 0
    for name, fn in tests:
        try:
            fn()
            passed += 1
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
