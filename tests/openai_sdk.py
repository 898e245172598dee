"""Kiln against the real `openai` Python SDK.

Usage: python3 tests/openai_sdk.py BASE_URL API_KEY MODEL
(run by tests/api_openai_sdk.rs against an in-process server). Prints one line per check and
'N passed, N failed'; exits non-zero on any failure.
"""

import sys
import traceback

import openai
from openai import OpenAI

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
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


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
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
