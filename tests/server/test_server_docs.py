"""The Swagger UI and the OpenAPI document: served from local files (no internet), and
generated from ``schemas/`` so they cannot drift from what the server validates."""
import re

import jsonschema
import openapi_spec_validator
import pytest

from geniex.server.validation import schemas
from serverproc import DEMO, AppServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An in-process server (no model is loaded by these tests), /metrics on."""
    with AppServer(tmp_path_factory.mktemp("docs-data"), metrics=True) as s:
        yield s


def test_root_redirects_to_the_swagger_ui(server):
    r = server.get("/", allow_redirects=False)
    assert r.status_code in (301, 302, 308) and r.headers["Location"].endswith("/docs/")
    assert server.get("/").url == server.url + "/docs/"


def test_swagger_page_and_every_asset_it_names_are_local(server):
    page = server.get("/docs/").text
    assert "SwaggerUIBundle" in page and "validatorUrl: null" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)            # no CDN
    assets = re.findall(r"(?:src|href)=\"([^\"]+)\"", page)
    assert {"/docs/swagger-ui-bundle.js", "/docs/swagger-ui.css"} <= set(assets)
    for asset in assets:
        r = server.get(asset)
        assert r.status_code == 200 and len(r.content) > 100, asset
    spec_url = re.search(r'url: "([^"]+)"', page).group(1)
    assert server.get(spec_url).json()["openapi"].startswith("3.1")


def test_openapi_document_is_valid(server):
    openapi_spec_validator.validate(server.get("/openapi.json").json())


# The documentation's own pages: the only routes the document does not describe.
DOC_PAGES = {"docs.root", "docs.swagger_page", "docs.swagger_file", "docs.openapi_json"}


def _served(app):
    """{endpoint: {(path, method)}} of the app's routes, paths in OpenAPI's spelling."""
    out = {}
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        out.setdefault(rule.endpoint, set()).update((path, m.lower()) for m in rule.methods - {"HEAD", "OPTIONS"})
    return out


def test_openapi_document_describes_the_routes_the_app_serves(server):
    # Against Flask's url_map, not the table the document is built from: every
    # documented operation is served, and every route but the documentation's own is
    # documented (under one of its paths: /v1/health, /completions, /models ... are
    # aliases of documented ones).
    doc = server.get("/openapi.json").json()
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    served = _served(server.app)
    every = set().union(*served.values())
    assert documented - every == set()
    undocumented = {endpoint: sorted(ops) for endpoint, ops in served.items()
                    if endpoint not in DOC_PAGES and not ops & documented}
    assert undocumented == {}


def _answers_as_documented(doc, path, method, r):
    """``r``, an answer to ``method path``: its status is one the document lists for
    the operation, its type one that status has, and a JSON body validates against
    that status's schema (the document's own components resolve its references)."""
    responses = doc["paths"][path][method]["responses"]
    assert str(r.status_code) in responses, (method, path, r.status_code, r.text[:300])
    content = responses[str(r.status_code)]["content"]
    kind = r.headers["Content-Type"].split(";")[0]
    assert kind in content, (method, path, kind, sorted(content))
    if kind == "application/json":
        schema = {**content[kind]["schema"], "components": doc["components"]}
        jsonschema.Draft202012Validator(schema).validate(r.json())


def test_the_server_answers_as_its_document_says(server):
    # Every operation, answered without a model: GETs as they are (a stored model by
    # name, and one that is not stored), operations with a request body given a body
    # that is no JSON object (the 400 every request schema starts with).
    doc = server.get("/openapi.json").json()
    checked = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if "requestBody" in op:
                r = server.post(path, [])
                assert r.status_code == 400, (path, r.status_code, r.text[:300])
                answers = [r]
            elif method == "get":
                names = (DEMO, "nobody/nothing:Q4_0") if "{model}" in path else ("",)
                answers = [server.get(path.replace("{model}", name)) for name in names]
            else:
                answers = [server.post(path, {})]
            for r in answers:
                _answers_as_documented(doc, path, method, r)
                checked += 1
    assert checked == sum(map(len, doc["paths"].values())) + 1
    assert server.health()["model"] is None                  # nothing was loaded


def test_openapi_document_follows_the_schema_files(server):
    doc = server.get("/openapi.json").json()
    components = doc["components"]["schemas"]
    for file, title, path in (("chat_completions.request.json", "ChatCompletionRequest", "/v1/chat/completions"),
                              ("completions.request.json", "CompletionRequest", "/v1/completions")):
        assert set(components[title]["properties"]) == set(schemas()[file]["properties"])
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{title}"
    assert {"spec_type", "spec_draft_model", "spec_n_max", "spec_n_min", "spec_p_min"} <= \
        set(components["ChatCompletionRequest"]["properties"])
    assert components["ChatCompletionRequest"]["properties"]["spec_n_max"]["default"] == 3
    sampling = components["SamplingFields"]["properties"]
    assert {"top_k", "min_p", "repetition_penalty"} <= set(sampling)
    assert {"nctx", "ngl", "compute"} <= set(components["LoadFields"]["properties"])
    # Every reference points inside the document.
    text = str(doc)
    for ref in re.findall(r"'\$ref': '([^']+)'", text):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in components, ref
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/models",
                                 "/v1/models/{model}", "/health", "/v1/spec/reset", "/chat/completions",
                                 "/completion", "/infill", "/tokenize", "/detokenize", "/apply-template",
                                 "/props", "/slots", "/metrics", "/v1/embeddings", "/embeddings", "/rerank",
                                 "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/v1/logits"}


# -- the application factory, in process (no model is loaded by these) -------------------


@pytest.mark.fast
def test_create_app_cors_with_a_list_of_origins(tmp_path):
    from geniex.server.app import ServerConfig, create_app
    app = create_app(ServerConfig(data_dir=tmp_path, origins="http://a.test, http://b.test"))
    try:
        client = app.test_client()
        r = client.get("/v1/models", headers={"Origin": "http://b.test"})
        assert r.headers["Access-Control-Allow-Origin"] == "http://b.test" and "Origin" in r.headers["Vary"]
        r = client.get("/v1/models", headers={"Origin": "http://evil.test"})
        assert "Access-Control-Allow-Origin" not in r.headers
        r = client.post("/v1/chat/completions", json={"model": 3, "messages": []})
        assert r.status_code == 400 and r.json["error"]["param"] == "model"
    finally:
        app.extensions["geniex.answerer"].cache.close()


@pytest.mark.fast
def test_parse_host():
    from geniex.errors import UsageError
    from geniex.server.serving import parse_host
    assert parse_host("127.0.0.1:18181") == ("127.0.0.1", 18181)
    assert parse_host("[::1]:8080") == ("::1", 8080)
    assert parse_host("0.0.0.0:0") == ("0.0.0.0", 0)
    for bad in ("localhost", "127.0.0.1:http", "127.0.0.1:70000"):
        with pytest.raises(UsageError, match="expected HOST:PORT"):
            parse_host(bad)
