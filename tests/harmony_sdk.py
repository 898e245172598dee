"""The harmony format (gpt-oss) through the real `openai` Python SDK.

Usage: python3 tests/harmony_sdk.py BASE_URL API_KEY MODEL IDS
(run by tests/api_harmony.rs against a server whose vocabulary has the harmony special tokens
and whose chat template is gpt-oss's; IDS is JSON naming the ids of `<|end|>`, `<|start|>`,
`<|channel|>` and `<|message|>`). The model has random weights, so a guided grammar makes it
write harmony where the check needs a given shape. Prints one line per check and
'N passed, N failed'; exits non-zero on any failure.
"""

import json
import sys
import traceback

import openai
from openai import OpenAI

BASE, KEY, MODEL, IDS = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
TWO_CHANNELS = (
    'start: <[{c}]> "analysis" <[{m}]> /[a-z]{{2,6}}( [a-z]{{2,6}}){{1,3}}/ <[{e}]> <[{s}]> "assistant" '
    '<[{c}]> "final" <[{m}]> /[A-Z][a-z]{{2,6}}( [a-z]{{2,6}}){{1,3}}\\./'
).format(c=IDS["channel"], m=IDS["message"], e=IDS["end"], s=IDS["start"])


def streamed(**kw):
    """Reasoning, content, calls (name, arguments) and finish reason of a streamed chat."""
    reasoning, content, calls, finish = "", "", {}, None
    for c in client.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        d = c.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.id:
                assert t.index not in calls and t.function.name, t
                calls[t.index] = [t.function.name, ""]
            calls[t.index][1] += t.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    return reasoning, content, [tuple(calls[i]) for i in sorted(calls)], finish


def check_reasoning_effort_and_stream_add_up():
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=60, temperature=0,
              reasoning_effort="low", extra_body={"guided_grammar": TWO_CHANNELS})
    res = client.chat.completions.create(**kw)
    msg = res.choices[0].message
    reasoning = getattr(msg, "reasoning_content", None)
    assert reasoning and msg.content and msg.content.endswith("."), msg
    assert "<|" not in reasoning + msg.content, msg
    assert res.choices[0].finish_reason == "stop" and not msg.tool_calls, res
    assert streamed(**kw) == (reasoning, msg.content, [], "stop")
    low = res.usage.prompt_tokens
    high = client.chat.completions.create(**{**kw, "reasoning_effort": "high", "max_tokens": 1})
    assert high.usage.prompt_tokens > 0 and low > 0


def check_bad_reasoning_effort_is_a_400():
    for effort in ("minimal", "max"):
        try:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=1, reasoning_effort=effort)
        except openai.BadRequestError as e:
            assert e.body["param"] == "reasoning_effort", e.body
        else:
            raise AssertionError(f"reasoning_effort={effort!r} was accepted")


def check_tool_choice_required_and_round_trip():
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    kw = dict(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=120,
              temperature=0, logit_bias={str(IDS["end"]): 30})
    res = client.chat.completions.create(**kw)
    choice = res.choices[0]
    assert choice.finish_reason == "tool_calls", res
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city"} and len(args["city"]) <= 12, args
    reasoning = getattr(choice.message, "reasoning_content", None) or ""
    assert streamed(**kw) == (reasoning, "", [("get_weather", call.function.arguments)], "tool_calls")
    # The call and the tool's result go back; the answer is constrained to harmony's channels.
    turns = messages + [
        {"role": "assistant", "content": None, "reasoning_content": reasoning or None,
         "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=turns, tools=[WEATHER], max_tokens=60, temperature=0,
        extra_body={"guided_grammar": TWO_CHANNELS})
    msg = answer.choices[0].message
    assert answer.choices[0].finish_reason == "stop" and msg.content and not msg.tool_calls, answer
    assert answer.usage.prompt_tokens > res.usage.prompt_tokens + 10, (answer.usage, res.usage)


def main():
    tests = [(n, f) for n, f in globals().items() if n.startswith("check_") and callable(f)]
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
