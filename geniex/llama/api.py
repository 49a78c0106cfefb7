"""The llama.cpp C API as this project uses it: structs and function declarations.

Everything that crosses the C boundary is declared here once, with ``argtypes`` and
``restype``, against llama.cpp build b11549 (the library inside
``xllamacpp==2026.10.11549``). Struct layouts change between builds, so
:func:`geniex.llama.library.load` refuses a library whose defaults do not match the
layouts below before any of these declarations is used.

Nothing outside ``geniex.llama`` imports ctypes (the one C function not of llama.cpp,
glibc's ``malloc_trim``, is :mod:`geniex.llama.libc`).
"""
import ctypes
from ctypes import (
    CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_float, c_int, c_int8, c_int32,
    c_size_t, c_uint8, c_uint32, c_void_p,
)

llama_token = c_int32
llama_pos = c_int32
llama_seq_id = c_int32

# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line)
ggml_log_callback = CFUNCTYPE(None, c_int, c_char_p, c_void_p)

# enum llama_context_type
LLAMA_CONTEXT_TYPE_DEFAULT = 0
LLAMA_CONTEXT_TYPE_MTP = 1
# enum llama_vocab_type
LLAMA_VOCAB_TYPE_NONE = 0          # a model without a tokenizer
# enum llama_flash_attn_type
LLAMA_FLASH_ATTN_TYPE_AUTO = -1
# enum ggml_backend_dev_type
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3
# enum llama_pooling_type (-1, unspecified: the model's own, from {arch}.pooling_type;
# every value's name in POOLING_NAMES)
LLAMA_POOLING_TYPE_NONE = 0
LLAMA_POOLING_TYPE_RANK = 4      # a reranker's classification head
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
# enum llama_token_attr: bits of llama_vocab_get_attr (the grammar backend marks control tokens)
LLAMA_TOKEN_ATTR_CONTROL = 1 << 3
LLAMA_TOKEN_ATTR_USER_DEFINED = 1 << 4


class llama_model_params(Structure):
    """struct llama_model_params at b11549 (80 bytes)."""

    _fields_ = [
        ("devices", c_void_p),                 # ggml_backend_dev_t*, NULL-terminated; NULL = auto
        ("tensor_buft_overrides", c_void_p),
        ("n_gpu_layers", c_int32),             # -1 = all
        ("split_mode", c_int),
        ("load_mode", c_int),
        ("lazy_mode", c_int),
        ("main_gpu", c_int32),
        ("tensor_split", POINTER(c_float)),
        ("progress_callback", c_void_p),
        ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p),
        ("vocab_only", c_bool),
        ("check_tensors", c_bool),
        ("use_extra_bufts", c_bool),
        ("no_host", c_bool),
        ("no_alloc", c_bool),
        ("load_mtp", c_bool),                  # load NextN layers bundled in the target GGUF
    ]


class llama_context_params(Structure):
    """struct llama_context_params at b11549 (168 bytes)."""

    _fields_ = [
        ("n_ctx", c_uint32),
        ("n_batch", c_uint32),
        ("n_ubatch", c_uint32),
        ("n_seq_max", c_uint32),
        ("n_rs_seq", c_uint32),
        ("n_outputs_max", c_uint32),
        ("n_outputs_max_per_seq", c_uint32),
        ("n_threads", c_int32),                # one-row decodes
        ("n_threads_batch", c_int32),          # multi-row batches (prefill, verify)
        ("ctx_type", c_int),                   # LLAMA_CONTEXT_TYPE_*; offset 36
        ("rope_scaling_type", c_int),
        ("pooling_type", c_int),
        ("attention_type", c_int),
        ("flash_attn_type", c_int),
        ("rope_freq_base", c_float),
        ("rope_freq_scale", c_float),
        ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float),
        ("yarn_beta_fast", c_float),
        ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32),
        ("defrag_thold", c_float),
        ("cb_eval", c_void_p),
        ("cb_eval_user_data", c_void_p),
        ("type_k", c_int),
        ("type_v", c_int),
        ("moe_cache_size", c_size_t),          # offset 112
        ("abort_callback", c_void_p),
        ("abort_callback_data", c_void_p),
        ("embeddings", c_bool),
        ("offload_kqv", c_bool),
        ("no_perf", c_bool),
        ("op_offload", c_bool),
        ("swa_full", c_bool),
        ("kv_unified", c_bool),
        ("samplers", c_void_p),
        ("n_samplers", c_size_t),
        ("ctx_other", c_void_p),               # MTP draft: the live target context; offset 160
    ]


class llama_batch(Structure):
    """struct llama_batch: parallel arrays of n_tokens rows (we own the memory)."""

    _fields_ = [
        ("n_tokens", c_int32),
        ("token", POINTER(llama_token)),
        ("embd", POINTER(c_float)),
        ("pos", POINTER(llama_pos)),
        ("n_seq_id", POINTER(c_int32)),
        ("seq_id", POINTER(POINTER(llama_seq_id))),
        ("logits", POINTER(c_int8)),
    ]


class llama_chat_message(Structure):
    """struct llama_chat_message."""

    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class RawParams(Structure):
    """A buffer larger than any params struct, used as the return type when probing a
    library's defaults: a struct this big is always returned through a caller-provided
    buffer, so a library with a larger struct cannot write past our memory."""

    _fields_ = [("raw", c_uint8 * 512)]


# b11549's layouts on 64-bit platforms: a wrong field here would shift every later one.
assert ctypes.sizeof(llama_model_params) == 80
assert ctypes.sizeof(llama_context_params) == 168
assert llama_context_params.ctx_type.offset == 36
assert llama_context_params.moe_cache_size.offset == 112
assert llama_context_params.ctx_other.offset == 160
assert ctypes.sizeof(llama_batch) == 56

# name -> (restype, argtypes). Every C function the project calls, declared once.
# Comments give the header's meaning where it is not obvious from the name.
FUNCTIONS = {
    # -- process --------------------------------------------------------------------
    "llama_backend_init": (None, []),
    "llama_log_set": (None, [ggml_log_callback, c_void_p]),
    "llama_print_system_info": (c_char_p, []),
    "llama_model_default_params": (RawParams, []),       # probed raw, then copied
    "llama_context_default_params": (RawParams, []),
    # -- devices (ggml-backend) ------------------------------------------------------
    "ggml_backend_dev_count": (c_size_t, []),
    "ggml_backend_dev_get": (c_void_p, [c_size_t]),
    "ggml_backend_dev_name": (c_char_p, [c_void_p]),
    "ggml_backend_dev_description": (c_char_p, [c_void_p]),
    "ggml_backend_dev_type": (c_int, [c_void_p]),
    # -- model ----------------------------------------------------------------------
    "llama_model_load_from_file": (c_void_p, [c_char_p, llama_model_params]),  # NULL on failure
    "llama_model_free": (None, [c_void_p]),
    "llama_model_get_vocab": (c_void_p, [c_void_p]),
    "llama_model_n_embd": (c_int32, [c_void_p]),
    "llama_model_n_embd_out": (c_int32, [c_void_p]),     # width of nextn hidden-state rows
    "llama_model_n_layer": (c_int32, [c_void_p]),
    "llama_model_n_layer_nextn": (c_int32, [c_void_p]),  # bundled NextN (MTP) layers
    "llama_model_n_head": (c_int32, [c_void_p]),
    "llama_model_n_ctx_train": (c_int32, [c_void_p]),
    "llama_model_is_recurrent": (c_bool, [c_void_p]),    # state instead of (only) a KV cache
    "llama_model_is_hybrid": (c_bool, [c_void_p]),       # attention + recurrent layers
    "llama_model_desc": (c_int32, [c_void_p, c_char_p, c_size_t]),
    "llama_model_size": (ctypes.c_uint64, [c_void_p]),
    "llama_model_n_params": (ctypes.c_uint64, [c_void_p]),
    "llama_model_chat_template": (c_char_p, [c_void_p, c_char_p]),  # NULL = none
    "llama_model_n_cls_out": (c_uint32, [c_void_p]),     # a classifier head's outputs (rerank)
    "llama_model_meta_val_str": (c_int32, [c_void_p, c_char_p, c_char_p, c_size_t]),
    # tmpl NULL = chatml; returns the formatted length (more than the buffer: call again
    # with a larger one), or -1 for a template the library does not recognise
    "llama_chat_apply_template": (c_int32, [c_char_p, POINTER(llama_chat_message), c_size_t,
                                            c_bool, c_char_p, c_int32]),
    # the names of the built-in formats (fills up to len of them; returns how many there are)
    "llama_chat_builtin_templates": (c_int32, [POINTER(c_char_p), c_size_t]),
    # -- vocab ----------------------------------------------------------------------
    "llama_vocab_n_tokens": (c_int32, [c_void_p]),
    "llama_vocab_type": (c_int, [c_void_p]),
    "llama_vocab_bos": (llama_token, [c_void_p]),
    "llama_vocab_eos": (llama_token, [c_void_p]),
    "llama_vocab_eot": (llama_token, [c_void_p]),
    "llama_vocab_is_eog": (c_bool, [c_void_p, llama_token]),
    "llama_vocab_get_add_bos": (c_bool, [c_void_p]),
    "llama_vocab_get_add_eos": (c_bool, [c_void_p]),
    "llama_vocab_get_text": (c_char_p, [c_void_p, llama_token]),
    # a token's enum llama_token_attr bits (LLAMA_TOKEN_ATTR_*)
    "llama_vocab_get_attr": (c_int, [c_void_p, llama_token]),
    # fill-in-the-middle tokens (-1 = the vocabulary has none)
    "llama_vocab_fim_pre": (llama_token, [c_void_p]),
    "llama_vocab_fim_suf": (llama_token, [c_void_p]),
    "llama_vocab_fim_mid": (llama_token, [c_void_p]),
    "llama_vocab_fim_pad": (llama_token, [c_void_p]),
    "llama_vocab_fim_rep": (llama_token, [c_void_p]),
    "llama_vocab_fim_sep": (llama_token, [c_void_p]),
    # returns the number of tokens, or minus the number needed when n_tokens_max is too small
    "llama_tokenize": (c_int32, [c_void_p, c_char_p, c_int32, POINTER(llama_token), c_int32,
                                 c_bool, c_bool]),
    # returns the byte count, or minus the size needed
    "llama_token_to_piece": (c_int32, [c_void_p, llama_token, c_char_p, c_int32, c_int32, c_bool]),
    # -- context --------------------------------------------------------------------
    "llama_init_from_model": (c_void_p, [c_void_p, llama_context_params]),  # NULL on failure
    "llama_free": (None, [c_void_p]),
    "llama_n_ctx": (c_uint32, [c_void_p]),
    "llama_n_batch": (c_uint32, [c_void_p]),
    "llama_n_ubatch": (c_uint32, [c_void_p]),
    "llama_n_seq_max": (c_uint32, [c_void_p]),
    # threads for one-row decodes, for multi-row batches; takes effect at the next decode
    "llama_set_n_threads": (None, [c_void_p, c_int32, c_int32]),
    "llama_n_threads": (c_int32, [c_void_p]),
    "llama_n_threads_batch": (c_int32, [c_void_p]),
    # 0 ok, 1 no KV slot (context full), 2 aborted, -1 invalid batch, < -1 error
    "llama_decode": (c_int32, [c_void_p, llama_batch]),
    "llama_get_logits_ith": (POINTER(c_float), [c_void_p, c_int32]),
    # -- embeddings (a context made with embeddings=true) --------------------------------
    "llama_pooling_type": (c_int, [c_void_p]),           # the context's (the model's unless overridden)
    # one sequence's pooled vector (n_embd floats; n_cls_out scores for RANK); NULL for NONE
    "llama_get_embeddings_seq": (POINTER(c_float), [c_void_p, llama_seq_id]),
    # output row i's vector (pooling NONE)
    "llama_get_embeddings_ith": (POINTER(c_float), [c_void_p, c_int32]),
    "llama_get_memory": (c_void_p, [c_void_p]),
    "llama_memory_clear": (None, [c_void_p, c_bool]),
    # remove positions [p0, p1) of a sequence (p1 < 0 = to the end)
    "llama_memory_seq_rm": (c_bool, [c_void_p, llama_seq_id, llama_pos, llama_pos]),
    # one sequence's state (its KV cells, recurrent state): bytes needed, copy out, copy in
    # (returns the bytes read; 0 when the state does not fit this context)
    "llama_state_seq_get_size": (c_size_t, [c_void_p, llama_seq_id]),
    "llama_state_seq_get_data": (c_size_t, [c_void_p, POINTER(c_uint8), c_size_t, llama_seq_id]),
    "llama_state_seq_set_data": (c_size_t, [c_void_p, POINTER(c_uint8), c_size_t, llama_seq_id]),
}

# Functions a library may lack (a Snapdragon build of another version, a trimmed build):
# their absence is a missing capability, reported when asked for, not a load failure.
OPTIONAL_FUNCTIONS = {
    "ggml_backend_load_all": (None, []),   # dynamic backends (ggml-hexagon.so, ...) next to the executable
    # the same, from a given folder (UTF-8 path): where a release archive was unpacked
    "ggml_backend_load_all_from_path": (None, [c_char_p]),
    # the backend registry, for the devices report: which backends provide which devices
    "ggml_backend_reg_count": (c_size_t, []),
    "ggml_backend_reg_get": (c_void_p, [c_size_t]),
    "ggml_backend_reg_name": (c_char_p, [c_void_p]),
    "ggml_backend_reg_dev_count": (c_size_t, [c_void_p]),
    "ggml_backend_dev_backend_reg": (c_void_p, [c_void_p]),   # the registry a device belongs to
    # ggml's type traits (elements per block, bytes per block; 0 for removed types): the
    # tests check geniex.llama.gguf_file's own table against them
    "ggml_blck_size": (ctypes.c_int64, [c_int]),
    "ggml_type_size": (c_size_t, [c_int]),
    "ggml_row_size": (c_size_t, [c_int, ctypes.c_int64]),
    # Quantize rows of floats as the KV cache stores them (geniex.llama.kv_state turns a
    # sequence's F16 cells into the target's quantized ones): type, src, dst, first row
    # (times n_per_row: the element offset), rows, elements per row, importance matrix
    "ggml_quantize_chunk": (c_size_t, [c_int, POINTER(c_float), c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64, POINTER(c_float)]),
}

# The MTP hidden-state staging API is declared only in llama.cpp's private
# src/llama-ext.h and exported under C++-mangled names.
MANGLED_FUNCTIONS = {
    "llama_set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                                   None, [c_void_p, c_bool, c_bool]),
    "llama_get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context",
                                   POINTER(c_float), [c_void_p]),
    "llama_get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                                       POINTER(c_float), [c_void_p, c_int32]),
    "llama_set_nextn_layer_offset": ("_Z28llama_set_nextn_layer_offsetP13llama_contexti",
                                     None, [c_void_p, c_int32]),
    "llama_get_ctx_other": ("_Z19llama_get_ctx_otherP13llama_context", c_void_p, [c_void_p]),
}
