"""Kiln against the real `openai` Python SDK.

Usage: python3 tests/openai_sdk.py BASE_URL API_KEY MODEL [SUITE [LOGIT_BIAS]]
(run by tests/api_openai_sdk.rs against an in-process server). SUITE `structured` runs the
structured-output checks (`structured_*`, on a model with a real vocabulary), `reasoning`
the `reasoning_*` ones (a server with the `think` reasoning parser and `</think>` as a special
token; LOGIT_BIAS as JSON), `embeddings` the `embeddings_*` ones (a server started with
embeddings on), else the `test_*` checks run. Prints one line per check and 'N passed, N failed'; exits non-zero on
any failure.
"""

import json
import os
import sys
import traceback
from typing import List, Literal

import openai
from openai import OpenAI
from pydantic import BaseModel, Field

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
SUITE = sys.argv[4] if len(sys.argv) > 4 else "test"
client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=60)
PROMPT = "Once upon a time"
MESSAGES = [
    {"role": "system", "content": "You tell short stories."},
    {"role": "user", "content": "Tell me about a cat."},
]


def test_models():
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL], models


def test_completion_and_stream_agree():
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    choice = full.choices[0]
    assert choice.index == 0 and choice.finish_reason in ("stop", "length") and choice.text
    assert full.usage.prompt_tokens == 5
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text, (text, choice.text)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_and_stream_agree():
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=24, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content, (text, msg.content)
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason], finishes


def test_n():
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, n=2, seed=5)
    assert [c.index for c in res.choices] == [0, 1]
    res = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, n=2, seed=5)
    assert [c.index for c in res.choices] == [0, 1]


def test_stop():
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    cut = full.index(" was")
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=[" was"])
    assert res.choices[0].text == full[:cut] and res.choices[0].finish_reason == "stop", res


def test_logprobs():
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    lp = res.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    assert "".join(lp.tokens) == res.choices[0].text
    res = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = res.choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == res.choices[0].message.content


def test_echo_logprobs_score_the_prompt():
    # The lm-eval-harness call: the prompt's logprobs alone, first token null.
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = res.choices[0]
    lp = choice.logprobs
    assert choice.text == PROMPT and choice.finish_reason == "length", res
    assert len(lp.tokens) == res.usage.prompt_tokens == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x < 0 for x in lp.token_logprobs[1:])
    assert all(lp.tokens[i] in lp.top_logprobs[i] for i in range(1, len(lp.tokens)))


def expect(exc, fn):
    try:
        fn()
    except exc as e:
        body = e.body if isinstance(e.body, dict) else {}
        assert isinstance(body.get("code"), str), body
        return e
    raise AssertionError(f"expected {exc.__name__}")


def test_errors():
    e = expect(openai.BadRequestError, lambda: client.completions.create(model=MODEL, prompt=PROMPT, temperature=5))
    assert e.status_code == 400 and e.body["param"] == "temperature"
    expect(openai.BadRequestError, lambda: client.chat.completions.create(model=MODEL, messages=[]))
    expect(openai.NotFoundError, lambda: client.completions.create(model="no-such-model", prompt=PROMPT))
    bad = OpenAI(base_url=BASE + "/v1", api_key="sk-wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: bad.models.list())


def test_models_retrieve():
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model", m
    e = expect(openai.NotFoundError, lambda: client.models.retrieve("no-such-model"))
    assert e.body["code"] == "model_not_found", e.body


def test_request_id():
    res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2,
                                    extra_headers={"x-request-id": "sdk-req-1"})
    assert res._request_id == "sdk-req-1", res._request_id
    res = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert res._request_id and len(res._request_id) == 32, res._request_id


def test_cached_tokens_and_fingerprint():
    import uuid
    prompt = uuid.uuid4().hex + " " + "Once upon a time there was a cat who sat in the sun. " * 10
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0, first.usage
    hit = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < hit < again.usage.prompt_tokens, again.usage
    msgs = [{"role": "user", "content": prompt}]
    client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=2, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0, chunks[-1].usage
    fp = first.system_fingerprint
    assert fp and fp.startswith("fp_") and fp == again.system_fingerprint, (fp, again)
    assert all(c.system_fingerprint == fp for c in chunks), chunks


def test_context_length_error():
    # litellm and others match this wording to raise their context-window error.
    e = expect(openai.BadRequestError, lambda: client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=100000))
    assert e.code == "context_length_exceeded", e.body
    assert "This model's maximum context length is" in e.message, e.message
    assert "However, you requested 100005 tokens (5 in the prompt, 100000 in the completion)" in e.message, e.message
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT * 2000}]))
    assert e.code == "context_length_exceeded" and "maximum context length" in e.message, e.body


# --- tools (issue 16) ---------------------------------------------------------------------
# Set to True once constrained decoding is merged: `tool_choice="required"` then must hold.
CONSTRAINED_TOOLS = True
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}]
TOOL_TURNS = MESSAGES + [
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
]


def stream_calls(**kw):
    """Streamed content and tool calls put together the way openai-python's helpers do."""
    content, calls, finish = "", {}, None
    for c in client.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.id:
                assert t.index not in calls and t.function.name, t
                calls[t.index] = [t.function.name, ""]
            calls[t.index][1] += t.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def test_tools_conversation_round_trip():
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0)
    res = client.chat.completions.create(
        model=MODEL, messages=TOOL_TURNS, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert res.choices[0].message.role == "assistant"
    assert res.usage.prompt_tokens > plain.usage.prompt_tokens + 20, (res.usage, plain.usage)
    msg = res.choices[0].message
    assert "<tool_call>" not in (msg.content or "")
    content, calls, finish = stream_calls(
        model=MODEL, messages=TOOL_TURNS, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert content == (msg.content or "") and finish == res.choices[0].finish_reason
    assert calls == [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    none = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=8, temperature=0
    )
    assert none.choices[0].message.tool_calls is None and isinstance(none.choices[0].message.content, str)
    e = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "missing"}},
    ))
    assert e.body["param"] == "tool_choice.function.name", e.body


def test_tool_choice_required():
    if not CONSTRAINED_TOOLS:
        print("     (skipped until constrained decoding is merged)")
        return
    kw = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=300, temperature=0)
    res = client.chat.completions.create(**kw)
    choice = res.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    import json
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert set(args) == {"city"} and isinstance(args["city"], str) and len(args["city"]) <= 12
    content, calls, finish = stream_calls(**kw)
    assert finish == "tool_calls"
    assert calls == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]


class Address(BaseModel):
    zip: str = Field(pattern=r"^[0-9]{5}$")
    city: Literal["Oslo", "Lima"]


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user", "guest"]
    tags: List[bool] = Field(max_length=3)
    address: Address


def structured_parse_returns_a_pydantic_object():
    res = client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Person, max_tokens=200, temperature=0
    )
    choice = res.choices[0]
    assert choice.finish_reason == "stop", res
    assert isinstance(choice.message.parsed, Person), choice.message
    assert choice.message.parsed == Person.model_validate_json(choice.message.content)


def structured_stream_matches():
    with client.chat.completions.stream(
        model=MODEL, messages=MESSAGES, response_format=Person, max_tokens=200, temperature=0
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person), final
    once = client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Person, max_tokens=200, temperature=0
    )
    assert final.choices[0].message.content == once.choices[0].message.content


def structured_vllm_fields_through_extra_body():
    res = client.completions.create(
        model=MODEL, prompt="Pick one:", max_tokens=10, temperature=1.0, seed=1,
        extra_body={"guided_choice": ["alpha", "beta gamma"]},
    )
    assert res.choices[0].text in ("alpha", "beta gamma"), res
    res = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{4}"}},
    )
    text = res.choices[0].message.content
    assert len(text) == 4 and text.isdigit(), text


def structured_bad_schema_is_400():
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
    e = expect(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=bad),
    )
    assert e.status_code == 400 and e.body["param"] == "response_format", e.body
    res = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, response_format={"type": "json_object"}
    )
    assert res.choices[0].message.content.startswith("{"), res
    json.dumps(res.model_dump())


def reasoning_then_a_constrained_tool_call():
    """With the `think` reasoning parser and a tool constraint: the thinking streams as
    `delta.reasoning_content`, then the call as `delta.tool_calls` (index, id and name first,
    then argument pieces), nothing in `delta.content`. argv[5]: a logit bias under which the
    random model thinks a few tokens, then closes `</think>`."""
    bias = json.loads(sys.argv[5])
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        kw = dict(model=MODEL, messages=messages, tools=TOOLS, tool_choice=tool_choice, max_tokens=80,
                  temperature=0, logit_bias=bias, frequency_penalty=2.0, presence_penalty=2.0)
        res = client.chat.completions.create(**kw)
        choice = res.choices[0]
        msg = choice.message
        assert choice.finish_reason == "tool_calls", res
        reasoning = getattr(msg, "reasoning_content", None)
        assert reasoning and not msg.content, msg
        [call] = msg.tool_calls
        assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert set(args) == {"city"} and len(args["city"]) <= 12, args

        order, thought, pieces, finish = "", "", [], None
        for c in client.chat.completions.create(stream=True, **kw):
            if not c.choices:
                continue
            d = c.choices[0].delta
            if getattr(d, "reasoning_content", None):
                order += "r"
                thought += d.reasoning_content
            if d.content:
                order += "c"
            if d.tool_calls:
                order += "t"
                pieces += d.tool_calls
            finish = c.choices[0].finish_reason or finish
        assert order.startswith("r") and set(order.lstrip("r")) == {"t"}, order
        first, rest = pieces[0], pieces[1:]
        assert first.index == 0 and first.id and first.type == "function", first
        assert first.function.name == "get_weather", first
        assert all(p.index == 0 and p.id is None and p.function.name is None for p in rest), rest
        arguments = "".join(p.function.arguments or "" for p in pieces)
        assert (thought, arguments, finish) == (reasoning, call.function.arguments, "tool_calls"), (
            thought, arguments, finish)


def embeddings_float_and_base64_agree():
    texts = ["Once upon a time", "The cat sat on the mat."]
    # The SDK asks for base64 by default and decodes the vectors itself.
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=texts)
    wire = json.loads(raw.http_response.text)
    assert all(isinstance(d["embedding"], str) for d in wire["data"]), wire
    default = raw.parse()
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in default.data] == [0, 1], default
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens > 0, (default, floats)
    assert default.usage.total_tokens == default.usage.prompt_tokens, default
    for a, b in zip(default.data, floats.data):
        assert len(a.embedding) == len(b.embedding) > 0
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-5
        assert abs(sum(x * x for x in a.embedding) - 1.0) < 1e-4
    assert max(abs(x - y) for x, y in zip(floats.data[0].embedding, floats.data[1].embedding)) > 1e-3


def embeddings_dimensions_ids_and_errors():
    cut = client.embeddings.create(model=MODEL, input=[[1, 400, 300]], dimensions=8, user="u")
    v = cut.data[0].embedding
    assert len(v) == 8 and abs(sum(x * x for x in v) - 1.0) < 1e-4, v
    assert cut.usage.prompt_tokens == 3, cut
    expect(openai.BadRequestError, lambda: client.embeddings.create(model=MODEL, input=[]))
    expect(openai.BadRequestError,
           lambda: client.embeddings.create(model=MODEL, input="a", dimensions=100000))
    expect(openai.NotFoundError, lambda: client.embeddings.create(model="nope", input="a"))


def embeddings_langchain_openai_embeddings():
    # langchain's OpenAIEmbeddings, as a RAG stack calls it (check_embedding_ctx_length=False:
    # its default counts tokens with tiktoken's OpenAI vocabularies, not the served model's).
    try:
        from langchain_openai import OpenAIEmbeddings
    except ImportError:
        if os.environ.get("KILN_REQUIRE_LANGCHAIN") == "1":
            raise
        print("     (langchain-openai not installed: skipped)")
        return
    emb = OpenAIEmbeddings(model=MODEL, base_url=BASE + "/v1", api_key=KEY, max_retries=0,
                           check_embedding_ctx_length=False)
    docs = emb.embed_documents(["Once upon a time", "The cat sat on the mat."])
    query = emb.embed_query("Once upon a time")
    ref = client.embeddings.create(model=MODEL, input="Once upon a time",
                                   encoding_format="float").data[0].embedding
    assert len(docs) == 2 and len(query) == len(ref) > 0, (len(docs), len(query))
    assert max(abs(x - y) for x, y in zip(docs[0], query)) < 1e-5
    assert max(abs(x - y) for x, y in zip(query, ref)) < 1e-5
    assert max(abs(x - y) for x, y in zip(docs[0], docs[1])) > 1e-3


def main():
    prefix = {"structured": "structured_", "reasoning": "reasoning_",
              "embeddings": "embeddings_"}.get(SUITE, "test_")
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
