"""Kiln's /v1/responses against the real `openai` Python SDK (and the OpenAI Agents SDK).

Usage: python3 tests/responses_sdk.py BASE_URL API_KEY MODEL SUITE [RESPONSE_ID]
(run by tests/api_responses_sdk.rs against in-process servers on a model with a real
vocabulary and random weights). SUITE `responses` runs the `responses_*` checks and prints
`STORED <id>` for a stored response; `restart` (RESPONSE_ID: that id, on a new server over the
same store) the `restart_*` checks; `agents` the `agents_*` checks. Prints one line per check
and 'N passed, N failed'; exits non-zero on any failure.
"""

import json
import sys
import traceback
from typing import Literal

import openai
from openai import OpenAI

BASE, KEY, MODEL, SUITE = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=60)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False},
    "strict": True,
}


def responses_create_plain():
    r = client.responses.create(model=MODEL, input="Once upon a time", max_output_tokens=8,
                                temperature=0, instructions="Tell a story.", metadata={"k": "v"})
    assert r.id.startswith("resp_") and r.object == "response", r
    assert r.status in ("completed", "incomplete"), r.status
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.output_text == r.output[0].content[0].text and r.output_text, r.output_text
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.metadata == {"k": "v"} and r.instructions == "Tell a story."
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    print(f"STORED {r.id}")


def responses_stream_matches_create():
    kw = dict(model=MODEL, input=[{"role": "user", "content": "Once upon a time"}],
              max_output_tokens=16, temperature=0)
    whole = client.responses.create(**kw)
    # The SDK's accumulator checks the events' order; a reply cut by max_output_tokens ends
    # with `response.incomplete` (get_final_response wants `response.completed`).
    with client.responses.stream(**kw) as s:
        events = list(s)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert final.status == whole.status and final.id != whole.id, final
    assert "".join(deltas) == final.output_text == whole.output_text, (deltas, whole.output_text)
    assert final.usage.output_tokens == whole.usage.output_tokens
    kinds = [e.type for e in client.responses.create(stream=True, **kw)]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds


def responses_function_tool_round_trip():
    r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                tool_choice="required", parallel_tool_calls=False,
                                max_output_tokens=200, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    args = json.loads(calls[0].arguments)
    assert args["city"] in ("Paris", "Oslo"), args
    with client.responses.stream(model=MODEL, input="Weather?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=200, temperature=0) as s:
        for _ in s:
            pass
        streamed = s.get_final_response()
    assert streamed.status == "completed", streamed
    assert any(o.type == "function_call" for o in streamed.output), streamed.output
    follow = client.responses.create(
        model=MODEL, previous_response_id=r.id, tools=[WEATHER], max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "Sunny, 21 C"}])
    assert follow.previous_response_id == r.id
    assert follow.usage.input_tokens > r.usage.input_tokens
    items = client.responses.input_items.list(follow.id)
    assert [i.type for i in items.data] == ["function_call_output"], items


def responses_retrieve_and_delete():
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("retrieve after delete succeeded")
    except openai.NotFoundError:
        pass


def responses_errors():
    for kw, param in [(dict(tools=[{"type": "web_search"}]), "tools[0].type"),
                      (dict(background=True), "background")]:
        try:
            client.responses.create(model=MODEL, input="x", **kw)
            raise AssertionError(f"{kw} accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, e.body
    try:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
        raise AssertionError("unknown previous_response_id accepted")
    except openai.NotFoundError:
        pass


def restart_previous_response_id():
    rid = sys.argv[5]
    old = client.responses.retrieve(rid)
    assert old.id == rid and old.output_text
    r = client.responses.create(model=MODEL, previous_response_id=rid, input="And then?",
                                max_output_tokens=4)
    assert r.previous_response_id == rid
    assert r.usage.input_tokens > old.usage.input_tokens


def agents_one_function_tool():
    import asyncio

    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"Sunny in {city}"

    model = OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(
        base_url=BASE + "/v1", api_key=KEY, max_retries=0))
    # Random weights answer no question, so the run ends at the tool's output (a second turn
    # of free text would run to max_tokens, which the SDK raises on).
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model,
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                               max_tokens=120, temperature=0))
    result = asyncio.run(Runner.run(agent, "Weather in Paris?", max_turns=2))
    assert len(seen) == 1 and seen[0] in ("Paris", "Oslo"), seen
    assert result.final_output == f"Sunny in {seen[0]}", result.final_output


def main():
    prefix = {"responses": "responses_", "restart": "restart_", "agents": "agents_"}[SUITE]
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
