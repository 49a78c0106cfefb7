"""Fields of OpenAI's and Anthropic's APIs that would change the answer and cannot be
honoured here are a 400 naming them, never a 200 that ignores them; at their neutral
value (what the APIs' own clients send by default) they are accepted.

Checked through ``create_app()`` with no model: the schemas refuse before any model is
touched, so a neutral value gets as far as the model lookup (a 404 for a name the store
does not hold) and a refused one stops at the field."""
import pytest

from geniex.server.app import ServerConfig, create_app

pytestmark = pytest.mark.fast

CHAT = {"model": "nobody/nothing", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "nobody/nothing", "prompt": "hi"}
RESPONSE = {"model": "nobody/nothing", "input": "hi"}
MESSAGE = {"model": "nobody/nothing", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}

# (route, base body, field, a refused value, the neutral value, where the 400 points)
CASES = [
    ("/v1/chat/completions", CHAT, "functions", [{"name": "f", "parameters": {}}], [], "functions"),
    ("/v1/chat/completions", CHAT, "function_call", "auto", None, "function_call"),
    ("/v1/chat/completions", CHAT, "prediction", {"type": "file", "content": "x"}, {"type": "content", "content": "x"},
     "prediction.type"),
    ("/v1/chat/completions", CHAT, "audio", {"voice": "alloy", "format": "wav"}, None, "audio"),
    ("/v1/chat/completions", CHAT, "modalities", ["text", "audio"], ["text"], "modalities[1]"),
    ("/v1/chat/completions", CHAT, "web_search_options", {"search_context_size": "low"}, {}, "web_search_options"),
    ("/v1/chat/completions", CHAT, "verbosity", "low", "medium", "verbosity"),
    ("/v1/chat/completions", CHAT, "reasoning_effort", "high", None, "reasoning_effort"),
    ("/v1/completions", COMPLETION, "echo", True, False, "echo"),
    ("/v1/completions", COMPLETION, "suffix", "end", "", "suffix"),
    ("/v1/completions", COMPLETION, "best_of", 3, 1, "best_of"),
    ("/v1/responses", RESPONSE, "background", True, False, "background"),
    ("/v1/responses", RESPONSE, "conversation", "conv_1", None, "conversation"),
    ("/v1/responses", RESPONSE, "prompt", {"id": "pmpt_1"}, None, "prompt"),
    ("/v1/responses", RESPONSE, "max_tool_calls", 2, None, "max_tool_calls"),
    ("/v1/responses", RESPONSE, "top_logprobs", 5, 0, "top_logprobs"),
    ("/v1/responses", RESPONSE, "truncation", "auto", "disabled", "truncation"),
    ("/v1/responses", RESPONSE, "text", {"verbosity": "high"}, {"verbosity": "medium"}, "text.verbosity"),
    ("/v1/messages", MESSAGE, "container", "container_1", None, "container"),
    ("/v1/messages", MESSAGE, "mcp_servers", [{"type": "url", "url": "https://x.test", "name": "x"}], [],
     "mcp_servers"),
    ("/v1/messages", MESSAGE, "context_management", {"edits": [{"type": "clear_tool_uses_20250919"}]}, None,
     "context_management"),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    return create_app(ServerConfig(data_dir=tmp_path_factory.mktemp("foreign"))).test_client()


@pytest.mark.parametrize("route,base,field,refused,neutral,param", CASES,
                         ids=[f"{c[0].rsplit('/', 1)[1]}-{c[2]}" for c in CASES])
def test_a_field_that_would_change_the_answer_is_refused_by_name(client, route, base, field, refused, neutral,
                                                                 param):
    r = client.post(route, json={**base, field: refused})
    error = r.get_json()["error"]
    assert (r.status_code, error["param"]) == (400, param), error
    assert error["message"].startswith(param + ": ")
    r = client.post(route, json={**base, field: neutral})
    assert r.status_code == 404 and r.get_json()["error"]["param"] == "model", r.get_json()
