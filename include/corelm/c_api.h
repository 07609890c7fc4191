/* The C ABI of corelm (libcorelm.so): load a model and tokenize, generate, classify or score in
 * process, from C or any language with a C FFI (python/corelm/local.py wraps it with ctypes).
 * Plain C99: opaque handles, status codes, caller-owned buffers or library strings freed with
 * corelm_string_free. No C++ exception ever crosses it: every failure is a status code plus a
 * message, readable with corelm_last_error() on the same thread until its next corelm_* call.
 * A model handle serialises the calls made on it (one at a time; any thread).
 * See docs/SERVING.md, "C ABI and in-process Python". */
#ifndef CORELM_C_API_H
#define CORELM_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(CORELM_CAPI_BUILD)
#define CORELM_API __attribute__((visibility("default")))
#else
#define CORELM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum corelm_status {
  CORELM_OK = 0,
  CORELM_INVALID_ARGUMENT = 1, /* a null pointer, a malformed JSON option, a bad value */
  CORELM_IO_ERROR = 2,         /* a file missing or unreadable */
  CORELM_FORMAT_ERROR = 3,     /* a file present but malformed */
  CORELM_OUT_OF_MEMORY = 4,
  CORELM_BUFFER_TOO_SMALL = 5, /* the needed size is in the size out-parameter */
  CORELM_INTERNAL = 6          /* anything else (a bug: please report the message) */
} corelm_status;

typedef struct corelm_model corelm_model;

/* "corelm 0.1.0"; a static string. */
CORELM_API const char* corelm_version(void);

/* The message of this thread's last failed call ("" when none); valid until the next call. */
CORELM_API const char* corelm_last_error(void);

/* Any checkpoint corelm reads (model folder, GGUF, .safetensors + config.json) that carries a
 * tokenizer. options_json (may be NULL): {"tokenizer": PATH, "strict": true, "threads": 1}.
 * *out is NULL on failure. */
CORELM_API corelm_status corelm_model_load(const char* path, const char* options_json, corelm_model** out);
/* NULL is a no-op. */
CORELM_API void corelm_model_free(corelm_model* model);

/* Encodes text[0..len) (bytes, any content). Size query: ids == NULL (cap ignored) sets *n and
 * returns CORELM_OK; when cap is too small, *n is set and CORELM_BUFFER_TOO_SMALL returned. */
CORELM_API corelm_status corelm_tokenize(corelm_model* model, const char* text, size_t len, int add_special,
                                         int32_t* ids, size_t cap, size_t* n);
/* Decodes ids into buf (not NUL-terminated; *len bytes). Same size-query protocol with buf == NULL.
 * An id outside the vocabulary is CORELM_INVALID_ARGUMENT. */
CORELM_API corelm_status corelm_detokenize(corelm_model* model, const int32_t* ids, size_t n, char* buf, size_t cap,
                                           size_t* len);

/* Generates for n_prompts NUL-terminated prompts. params_json (may be NULL): {"max_tokens",
 * "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "no_repeat_ngram_size",
 * "seed", "stop": [..], "stop_at_eos", "add_special", "greedy"}; an unknown key is an error.
 * *out_json: [{"text", "tokens": [ids], "prompt_tokens", "finish_reason"}, ...] in prompt order;
 * free it with corelm_string_free. */
CORELM_API corelm_status corelm_generate(corelm_model* model, const char* const* prompts, size_t n_prompts,
                                         const char* params_json, char** out_json);

/* Label probabilities per text: the model's classification head when it has one (its template),
 * otherwise the likelihood of " " + label after "{text}\nLabel:" (as `corelm run classify`).
 * *out_json: [{"label", "probs": {label: p}, "margin", "logprob"} | {"error"}, ...]. */
CORELM_API corelm_status corelm_classify(corelm_model* model, const char* const* texts, size_t n,
                                         const char* const* labels, size_t n_labels, char** out_json);

/* Per text: the summed log-probability of tokens 2..T given their prefix (no BOS added) and the
 * count T - 1. *out_json: [{"logprob", "tokens", "mean_logprob"} | {"error"}, ...]. */
CORELM_API corelm_status corelm_score(corelm_model* model, const char* const* texts, size_t n, char** out_json);

/* Frees a string the library returned; NULL is a no-op. */
CORELM_API void corelm_string_free(char* s);

#ifdef __cplusplus
}
#endif

#endif /* CORELM_C_API_H */
