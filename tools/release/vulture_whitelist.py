"""Names `vulture geniex` cannot see used (run by .ci/run: ``vulture geniex
tools/release/vulture_whitelist.py``). Each is reached from outside Python's view of
the package: a framework calls it by name, the C library reads a struct field, or only
the tests and tools use it. Anything else vulture reports is dead code: delete it."""
_ = object()

# Flask routes: registered by decorator, called by the framework.
chat_completions, completions, swagger_page, swagger_file, openapi_json, health
openai_embeddings, llama_embeddings, rerank, count_tokens, get_model, apply_template
error_answer, give_memory_back, queue_wait     # app.py's errorhandler/after_request hooks
_webui_off                                     # docs.py's before_app_request hook (--no-webui)
regex, part_isolating                          # werkzeug's converter class attributes
_.merge_slashes                                # werkzeug's url_map setting
_.geniex_queue_wait, _.geniex_big_body, _.geniex_api_key    # flask.g, read with g.get() by name

# waitress (serving.py subclasses its channel and task): the base classes call these.
_.execute, _.content_length, error_task_class, _._flush_outbufs_below_high_watermark, _.will_close

# Jinja (template.py): extension tags, the sandbox's binop list, and its call() signature.
tags, intercepted_binops, __self

# ctypes/numpy: fields written for the C library or numpy to read.
_.flash_attn_type, _.writeable

# prometheus_client calls a collector's collect().
_.collect

# Used by tests and tools only: the schema generator (tools/release/sync_schemas.py and its
# test), state a test reads (the governor's switch count, the policy's learnt acceptance,
# a resolved model's draft flag, a reasoning budget's count and whether it closed the block,
# how many prompts the F16 reader read: proof a test's prompt took that path).
schema_properties, schema_unknown_pattern
_.switches, _.acceptance, is_draft, _.thought_tokens, _.closed_by_budget, _.reads
