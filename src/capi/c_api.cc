// The C ABI over the library: each entry point validates its pointers, runs the C++ call inside a
// catch-all and turns any exception into a status plus a thread-local message, so nothing thrown
// ever unwinds into a C caller. Classification and scoring reuse `corelm run`'s engine (the same
// numbers as the pipeline), generation the infer::TextGenerator.
#include "corelm/c_api.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/error.h"
#include "corelm/generate.h"
#include "corelm/model_loader.h"
#include "corelm/out_of_memory.h"
#include "corelm/pipeline.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"
#include "pipeline/engine.h"

struct corelm_model {
  corelm_model(std::string p, corelm::model::Checkpoint c) : path(std::move(p)), ckpt(std::move(c)) {}
  std::string path;
  corelm::model::Checkpoint ckpt;
  std::vector<corelm::TokenId> eos_ids;  // the checkpoint's EOS ids inside the vocabulary
  std::mutex mu;
};

namespace {

using namespace corelm;
using json = nlohmann::json;

thread_local std::string t_last_error;

// An argument error raised by the ABI layer itself (a null pointer, a bad key).
struct ArgError {
  std::string message;
};

corelm_status fail(corelm_status s, std::string message) {
  t_last_error = std::move(message);
  return s;
}

template <class F>
corelm_status guarded(const char* fn, F&& body) noexcept {
  t_last_error.clear();
  try {
    return body();
  } catch (const ArgError& e) {
    return fail(CORELM_INVALID_ARGUMENT, std::string(fn) + ": " + e.message);
  } catch (const OutOfMemoryError& e) {
    return fail(CORELM_OUT_OF_MEMORY, std::string(fn) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return fail(CORELM_OUT_OF_MEMORY, std::string(fn) + ": out of memory");
  } catch (const IOError& e) {
    return fail(CORELM_IO_ERROR, std::string(fn) + ": " + e.what());
  } catch (const FormatError& e) {
    return fail(CORELM_FORMAT_ERROR, std::string(fn) + ": " + e.what());
  } catch (const ValueError& e) {
    return fail(CORELM_INVALID_ARGUMENT, std::string(fn) + ": " + e.what());
  } catch (const json::exception& e) {
    return fail(CORELM_INVALID_ARGUMENT, std::string(fn) + ": " + e.what());
  } catch (const std::exception& e) {
    return fail(CORELM_INTERNAL, std::string(fn) + ": " + e.what());
  } catch (...) {
    return fail(CORELM_INTERNAL, std::string(fn) + ": unknown exception");
  }
}

void need(const void* p, const char* name) {
  if (p == nullptr) throw ArgError{std::string(name) + " is NULL"};
}

// A JSON object from an optional C string; `what` names the argument in errors.
json parse_object(const char* text, const char* what) {
  if (text == nullptr) return json::object();
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw ArgError{std::string(what) + " is not valid JSON: " + text};
  if (!j.is_object()) throw ArgError{std::string(what) + " must be a JSON object, got " + j.dump()};
  return j;
}

template <class T>
T get_as(const json& j, const std::string& key, const char* what) {
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw ArgError{std::string(what) + " key \"" + key + "\" has the wrong type: " + j.at(key).dump()};
  }
}

// An integer key: a float (3.5) or a string is refused rather than truncated or converted.
int64_t get_int(const json& j, const std::string& key, const char* what, int64_t min) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw ArgError{std::string(what) + " key \"" + key + "\" must be an integer, got " + v.dump()};
  const int64_t x = v.get<int64_t>();
  if (x < min) throw ArgError{std::string(what) + " key \"" + key + "\" must be >= " + std::to_string(min) + ", got " + v.dump()};
  return x;
}

std::vector<std::string> string_list(const char* const* items, size_t n, const char* name) {
  if (n > 0) need(items, name);
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (items[i] == nullptr) throw ArgError{std::string(name) + "[" + std::to_string(i) + "] is NULL"};
    out.emplace_back(items[i]);
  }
  return out;
}

char* to_c_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.data(), s.size() + 1);
  return p;
}

infer::GenerateOptions generate_options(const json& p, const std::vector<TokenId>& eos_ids) {
  constexpr const char* what = "params_json";
  infer::GenerateOptions o;
  o.eos_ids = eos_ids;
  for (const auto& [key, value] : p.items()) {
    if (key == "max_tokens") {
      o.max_new_tokens = get_int(p, key, what, 0);
    } else if (key == "temperature") {
      o.sampling.temperature = get_as<float>(p, key, what);
    } else if (key == "top_k") {
      o.sampling.top_k = get_int(p, key, what, 0);
    } else if (key == "top_p") {
      o.sampling.top_p = get_as<float>(p, key, what);
    } else if (key == "min_p") {
      o.sampling.min_p = get_as<float>(p, key, what);
    } else if (key == "repetition_penalty") {
      o.sampling.repetition_penalty = get_as<float>(p, key, what);
    } else if (key == "no_repeat_ngram_size") {
      o.sampling.no_repeat_ngram_size = get_int(p, key, what, 0);
    } else if (key == "greedy") {
      o.sampling.greedy = get_as<bool>(p, key, what);
    } else if (key == "seed") {
      if (!value.is_number_integer() || (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() < 0))
        throw ArgError{"params_json key \"seed\" must be a non-negative integer, got " + value.dump()};
      o.seed = value.get<uint64_t>();
    } else if (key == "stop") {
      o.stop = value.is_string() ? std::vector<std::string>{value.get<std::string>()}
                                 : get_as<std::vector<std::string>>(p, key, what);
    } else if (key == "stop_at_eos") {
      o.stop_at_eos = get_as<bool>(p, key, what);
    } else if (key == "add_special") {
      o.add_special = get_as<bool>(p, key, what);
    } else {
      throw ArgError{"params_json has an unknown key \"" + key +
                     "\" (known: max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, "
                     "no_repeat_ngram_size, greedy, seed, stop, stop_at_eos, add_special)"};
    }
  }
  try {
    o.sampling.validate();
  } catch (const ValueError& e) {
    throw ArgError{std::string("params_json: ") + e.what()};
  }
  return o;
}

// Runs every text through a pipeline engine for `spec` (batches of one length bucket, as the
// runner does); a text the engine refuses gets {"error": reason}.
json run_engine(corelm_model& m, pipeline::TaskSpec spec, const std::vector<std::string>& texts) {
  const auto& lm = m.ckpt.model;
  spec.truncate = pipeline::Truncate::Error;  // a C caller gets an error, never a silently cut text
  spec.validate();
  pipeline::Engine engine(lm.decoder, *lm.tokenizer, spec, int64_t(32) << 20);
  engine.set_batch(8);
  std::vector<std::optional<pipeline::PreparedDoc>> docs(texts.size());
  std::vector<std::string> errors(texts.size());
  std::map<int64_t, std::vector<pipeline::PreparedDoc*>> buckets;
  for (size_t i = 0; i < texts.size(); ++i) {
    docs[i] = engine.prepare(texts[i], errors[i]);
    if (docs[i]) buckets[engine.bucket(*docs[i])].push_back(&*docs[i]);
  }
  for (auto& [len, group] : buckets)
    for (size_t i = 0; i < group.size(); i += static_cast<size_t>(engine.batch_capacity())) {
      const size_t end = std::min(group.size(), i + static_cast<size_t>(engine.batch_capacity()));
      engine.run_batch(std::vector<pipeline::PreparedDoc*>(group.begin() + i, group.begin() + end));
    }
  json out = json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    if (!docs[i]) {
      out.push_back({{"error", errors[i]}});
      continue;
    }
    out.push_back(json::parse(docs[i]->result.dump()));
  }
  return out;
}

}  // namespace

extern "C" {

const char* corelm_version(void) { return "corelm 0.1.0"; }

const char* corelm_last_error(void) { return t_last_error.c_str(); }

corelm_status corelm_model_load(const char* path, const char* options_json, corelm_model** out) {
  return guarded("corelm_model_load", [&] {
    need(out, "out");
    *out = nullptr;
    need(path, "path");
    const json o = parse_object(options_json, "options_json");
    model::LoadOptions lo;
    for (const auto& [key, value] : o.items()) {
      if (key == "tokenizer") {
        lo.tokenizer_path = get_as<std::string>(o, key, "options_json");
      } else if (key == "strict") {
        lo.strict = get_as<bool>(o, key, "options_json");
      } else if (key == "threads") {
        set_num_threads(static_cast<int>(std::min<int64_t>(get_int(o, key, "options_json", 1), 1024)));
      } else {
        throw ArgError{"options_json has an unknown key \"" + key + "\" (known: tokenizer, strict, threads)"};
      }
    }
    auto m = std::make_unique<corelm_model>(path, model::load_model(path, lo));
    if (!m->ckpt.model.tokenizer) throw FormatError(std::string(path) + " carries no tokenizer");
    const auto vocab = static_cast<int64_t>(m->ckpt.model.tokenizer->vocab_size());
    for (int64_t id : m->ckpt.eos_ids)
      if (id >= 0 && id < vocab) m->eos_ids.push_back(static_cast<TokenId>(id));
    *out = m.release();
    return CORELM_OK;
  });
}

void corelm_model_free(corelm_model* model) { delete model; }

corelm_status corelm_tokenize(corelm_model* model, const char* text, size_t len, int add_special, int32_t* ids,
                              size_t cap, size_t* n) {
  return guarded("corelm_tokenize", [&] {
    need(model, "model");
    need(n, "n");
    if (len > 0) need(text, "text");
    std::lock_guard lock(model->mu);
    EncodeOptions eo;
    eo.add_special = add_special != 0;
    const std::vector<TokenId> v =
        model->ckpt.model.tokenizer->encode(std::string_view(len > 0 ? text : "", len), eo);
    *n = v.size();
    if (ids == nullptr) return CORELM_OK;
    if (cap < v.size())
      return fail(CORELM_BUFFER_TOO_SMALL, "corelm_tokenize: ids holds " + std::to_string(cap) + " ids, the text needs " +
                                               std::to_string(v.size()) + " (the size is in *n)");
    std::copy(v.begin(), v.end(), ids);
    return CORELM_OK;
  });
}

corelm_status corelm_detokenize(corelm_model* model, const int32_t* ids, size_t n, char* buf, size_t cap,
                                size_t* len) {
  return guarded("corelm_detokenize", [&] {
    need(model, "model");
    need(len, "len");
    if (n > 0) need(ids, "ids");
    std::lock_guard lock(model->mu);
    const auto& tok = *model->ckpt.model.tokenizer;
    for (size_t i = 0; i < n; ++i)
      if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= tok.vocab_size())
        throw ArgError{"ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                       std::to_string(tok.vocab_size()) + ")"};
    const std::string s = tok.decode(std::span<const TokenId>(ids, n));
    *len = s.size();
    if (buf == nullptr) return CORELM_OK;
    if (cap < s.size())
      return fail(CORELM_BUFFER_TOO_SMALL, "corelm_detokenize: buf holds " + std::to_string(cap) +
                                               " bytes, the text needs " + std::to_string(s.size()) +
                                               " (the size is in *len)");
    std::memcpy(buf, s.data(), s.size());
    return CORELM_OK;
  });
}

corelm_status corelm_generate(corelm_model* model, const char* const* prompts, size_t n_prompts,
                              const char* params_json, char** out_json) {
  return guarded("corelm_generate", [&] {
    need(out_json, "out_json");
    *out_json = nullptr;
    need(model, "model");
    const std::vector<std::string> ps = string_list(prompts, n_prompts, "prompts");
    const infer::GenerateOptions o = generate_options(parse_object(params_json, "params_json"), model->eos_ids);
    std::lock_guard lock(model->mu);
    json out = json::array();
    if (!ps.empty()) {
      const auto& lm = model->ckpt.model;
      infer::TextGenerator gen(lm.decoder, *lm.tokenizer);
      for (const auto& r : gen.generate(ps, o))
        out.push_back({{"text", r.text},
                       {"tokens", r.tokens},
                       {"prompt_tokens", r.prompt_tokens},
                       {"finish_reason", r.finish_reason}});
    }
    *out_json = to_c_string(out.dump(-1, ' ', false, json::error_handler_t::replace));
    return CORELM_OK;
  });
}

corelm_status corelm_classify(corelm_model* model, const char* const* texts, size_t n, const char* const* labels,
                              size_t n_labels, char** out_json) {
  return guarded("corelm_classify", [&] {
    need(out_json, "out_json");
    *out_json = nullptr;
    need(model, "model");
    const std::vector<std::string> ts = string_list(texts, n, "texts");
    pipeline::TaskSpec spec;
    spec.kind = pipeline::TaskKind::Classify;
    spec.labels = string_list(labels, n_labels, "labels");
    // A model with a classification head supplies its labels (when none are given) and template.
    pipeline::apply_model_task_defaults(spec, model->path);
    if (spec.labels.empty()) throw ArgError{"labels: none given and the model has no classification head"};
    std::lock_guard lock(model->mu);
    *out_json = to_c_string(run_engine(*model, spec, ts).dump(-1, ' ', false, json::error_handler_t::replace));
    return CORELM_OK;
  });
}

corelm_status corelm_score(corelm_model* model, const char* const* texts, size_t n, char** out_json) {
  return guarded("corelm_score", [&] {
    need(out_json, "out_json");
    *out_json = nullptr;
    need(model, "model");
    const std::vector<std::string> ts = string_list(texts, n, "texts");
    pipeline::TaskSpec spec;
    spec.kind = pipeline::TaskKind::Score;
    std::lock_guard lock(model->mu);
    json results = run_engine(*model, spec, ts);
    for (auto& r : results) {
      if (r.contains("error")) continue;
      const int64_t count = r["tokens"].get<int64_t>();
      const double mean = r["mean_logprob"].get<double>();
      json s{{"logprob", mean * static_cast<double>(count)}, {"tokens", count}, {"mean_logprob", mean}};
      r = std::move(s);
    }
    *out_json = to_c_string(results.dump(-1, ' ', false, json::error_handler_t::replace));
    return CORELM_OK;
  });
}

void corelm_string_free(char* s) { std::free(s); }

}  // extern "C"
