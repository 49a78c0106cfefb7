"""Drive real agent clients against a running ``geniex serve``: LangChain's
``ChatOpenAI`` (``bind_tools``, ``with_structured_output``) and LiteLLM, and print
what each got. Not a test (the clients are not test dependencies):

    pip install langchain-openai litellm
    geniex serve --model MODEL &            # a model whose template renders tools
    python tools/clients/check_clients.py --url http://127.0.0.1:18181 --model MODEL

A tiny model does not decide to call tools on its own; by default each check asks it
to repeat a call in its template's format (``--call``; Hermes/Qwen's by default), so
what is checked is the path from the model's text to the client's objects. Exit code
0 when every check got what it asked for.
"""
import argparse
import json
import sys
import traceback

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HERMES_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
SYSTEM = "You repeat the user's text exactly, nothing else."
ASK = "Repeat the following text exactly, with nothing before it:\n"


def messages(call):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK + call}]


def check(name, fn, results):
    try:
        ok, detail = fn()
    except Exception as e:  # noqa: BLE001 - a client's failure is a result to report
        ok, detail = False, f"{type(e).__name__}: {e}".splitlines()[0][:400]
        if "--traceback" in sys.argv:
            traceback.print_exc()
    results.append((name, ok, detail))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def langchain_checks(args, results):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    llm = ChatOpenAI(base_url=args.url + "/v1", api_key="none", model=args.model, temperature=0,
                     max_tokens=args.max_tokens)

    def bind_tools():
        msg = llm.bind_tools([WEATHER]).invoke(messages(args.call))
        calls = [(c["name"], c["args"]) for c in msg.tool_calls]
        return calls == [("get_weather", {"city": "Paris"})], f"tool_calls={calls} content={msg.content!r}"

    def bind_tools_stream():
        chunks = None
        for chunk in llm.bind_tools([WEATHER]).stream(messages(args.call)):
            chunks = chunk if chunks is None else chunks + chunk
        calls = [(c["name"], c["args"]) for c in chunks.tool_calls]
        return calls == [("get_weather", {"city": "Paris"})], f"tool_calls={calls}"

    class City(BaseModel):
        city: str

    def structured(method):
        def run():
            out = llm.with_structured_output(City, method=method).invoke(
                messages('{"city": "Paris"}' if method != "function_calling" else args.call.replace(
                    "get_weather", "City")))
            return isinstance(out, City), f"{out!r}"
        return run

    check("langchain ChatOpenAI.bind_tools().invoke", bind_tools, results)
    check("langchain ChatOpenAI.bind_tools().stream", bind_tools_stream, results)
    for method in ("json_schema", "function_calling", "json_mode"):
        check(f"langchain with_structured_output(method={method!r})", structured(method), results)


def litellm_checks(args, results):
    import litellm

    def completion(stream):
        def run():
            kw = dict(model="openai/" + args.model, api_base=args.url + "/v1", api_key="none",
                      messages=messages(args.call), tools=[WEATHER], max_tokens=args.max_tokens, temperature=0)
            if not stream:
                msg = litellm.completion(**kw).choices[0].message
                calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or ()]
            else:
                chunks = list(litellm.completion(stream=True, **kw))
                msg = litellm.stream_chunk_builder(chunks).choices[0].message
                calls = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or ()]
            return calls == [("get_weather", {"city": "Paris"})], f"tool_calls={calls}"
        return run

    check("litellm completion(tools)", completion(False), results)
    check("litellm completion(tools, stream=True)", completion(True), results)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:18181", help="the server (default %(default)s)")
    ap.add_argument("--model", required=True, help="a model the server has (GET /v1/models)")
    ap.add_argument("--call", default=HERMES_CALL, help="the call the model is asked to repeat")
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--traceback", action="store_true", help="print each failure's traceback")
    args = ap.parse_args(argv)
    results = []
    for name, checks in (("langchain-openai", langchain_checks), ("litellm", litellm_checks)):
        try:
            checks(args, results)
        except ImportError as e:
            results.append((name, False, f"not installed ({e})"))
            print(f"FAIL {name}: not installed ({e}); pip install {name}", flush=True)
    failed = [r for r in results if not r[1]]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
