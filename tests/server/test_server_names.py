"""What llama-server's operators set about the served model: ``--alias`` (more names of
``--model``, the first in sort order its id in ``/v1/models``), ``--tags``, and
``--no-webui`` (no Swagger UI; the API stays)."""
from serverproc import DEMO, AppServer, chat_body


def test_aliases_name_the_default_model_and_models_lists_them_with_its_tags(tmp_path):
    with AppServer(tmp_path / "data", parallel=1, model=DEMO, aliases=("tinyllama-2", "fim", "code"),
                   tags=("chat", "small")) as s:
        first = s.get("/v1/models").json()["data"][0]
        assert first["id"] == "code" and first["default"] and first["name"] == DEMO
        assert first["aliases"] == ["code", "fim", "tinyllama-2"] and first["tags"] == ["chat", "small"]
        r = s.chat({**chat_body(max_tokens=2), "model": "fim"})
        assert r.status_code == 200 and "warnings" not in r.json(), r.text     # by its name, not a fallback
        assert s.get("/v1/models/tinyllama-2").json()["id"] == DEMO
        assert s.get("/").status_code == 200                                    # the Swagger UI


def test_no_webui_serves_no_page_and_the_api_as_ever(tmp_path):
    with AppServer(tmp_path / "data", parallel=1, webui=False) as s:
        assert s.get("/").status_code == 404 and s.get("/docs/").status_code == 404
        assert s.get("/openapi.json").status_code == 200 and s.get("/health").status_code == 200
        assert "aliases" not in s.get("/v1/models").json()["data"][0]


def test_an_alias_without_a_model_is_refused_before_the_server_listens(cli):
    proc = cli("serve", "--host", "127.0.0.1:0", "--alias", "x", check_clean=False, timeout=60)
    assert proc.returncode != 0 and "--alias describes the default model: give --model too" in proc.stderr


def test_a_server_seed_makes_sampled_answers_repeat_and_props_shows_it(tmp_path):
    from geniex.server.placement import Defaults
    with AppServer(tmp_path / "data", parallel=1, defaults=Defaults(seed=42)) as s:
        assert s.get("/props").json()["default_generation_settings"]["params"]["seed"] == 42
        sampled = {**chat_body("Write a word.", max_tokens=12), "temperature": 1.5, "cache_prompt": False}
        texts = [s.chat(body).json()["choices"][0]["message"]["content"]
                 for body in (sampled, sampled, {**sampled, "seed": 42}, {**sampled, "seed": 7})]
        assert texts[0] == texts[1] == texts[2] != texts[3]      # --seed is a request's seed 42


def test_serve_refuses_a_seed_out_of_range(cli):
    proc = cli("serve", "--host", "127.0.0.1:0", "--seed", "0", check_clean=False, timeout=60)
    assert proc.returncode != 0 and "--seed 0: expected -1 (random)" in proc.stderr
