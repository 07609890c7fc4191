// The execution core: an OpenAI-shaped body -> scheduler requests -> the response object. The
// HTTP handlers, the queue worker and `corelm run batch` all go through here (executor.h).
#include "serve/executor.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "corelm/error.h"
#include "corelm/model_loader.h"
#include "serve/metrics.h"

namespace corelm::serve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::shared_ptr<LoadedModel> load_model_for_serving(const std::string& path, const ServeOptions& o) {
  auto l = std::make_shared<LoadedModel>(model::load_model(path));
  CORELM_CHECK(l->ckpt.model.tokenizer != nullptr, ValueError, path, ": the model has no tokenizer");
  if (o.precision != model::Precision::F32) l->ckpt.model.decoder.prepare_inference(o.precision);
  try {
    l->ckpt.model.decoder.set_kv_cache_types(o.kv_cache_types_for(model_id_for_path(path)));
  } catch (const ValueError& e) {
    throw ValueError(path + ": " + e.what() + " (--cache-type-k / --cache-type-v)");
  }
  const Tokenizer& tok = *l->ckpt.model.tokenizer;
  for (int64_t id : l->ckpt.eos_ids)
    if (id >= 0 && static_cast<size_t>(id) < tok.vocab_size()) l->eos_ids.push_back(static_cast<TokenId>(id));
  if (tok.eos_id()) l->eos_ids.push_back(*tok.eos_id());
  // Chat templates end a turn with their own token; stop there too (when the vocabulary has it).
  for (const char* t : {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>"})
    if (auto id = tok.token_to_id(t)) l->chat_stop_ids.push_back(*id);
  if (!l->ckpt.eos_token.empty())
    if (auto id = tok.token_to_id(l->ckpt.eos_token)) l->chat_stop_ids.push_back(*id);
  try {
    l->chat_template = std::make_unique<infer::ChatTemplate>(
        l->ckpt.chat_template.empty() ? infer::ChatTemplate::default_source() : l->ckpt.chat_template);
  } catch (const std::exception& e) {
    // The model stays usable for completions; chat requests get this message as a 400.
    l->chat_template_error = e.what();
  }
  infer::SchedulerOptions so;
  so.slots = o.slots;
  so.context = o.ctx;
  so.max_queue = o.max_queue;
  l->scheduler = std::make_unique<infer::Scheduler>(l->ckpt.model.decoder, tok, so);
  return l;
}

std::string random_hex(size_t n) {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  static const char* d = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& ch : s) ch = d[rng() & 15];
  return s;
}

uint64_t random_seed() {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(m);
  return rng();
}

std::string finish_for_api(const std::string& f) { return f == "length" ? "length" : "stop"; }

namespace {

std::string token_text(const Tokenizer& tok, TokenId id) {
  if (id < 0 || static_cast<size_t>(id) >= tok.vocab_size()) return "";
  return std::string(tok.token_bytes(id));
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

std::shared_ptr<const infer::Grammar> grammar_for(const ParsedRequest& r) {
  switch (r.format) {
    case OutputFormat::Text: return nullptr;
    case OutputFormat::JsonObject: return infer::Grammar::json_object();
    case OutputFormat::JsonSchema: return infer::Grammar::json_schema(r.schema);
    case OutputFormat::Regex: return infer::Grammar::regex(r.regex);
    case OutputFormat::Choices: return infer::Grammar::choices(r.choices);
  }
  return nullptr;
}

// Runs on_complete once, outside the lock, the first time the request is all done.
void maybe_complete(RequestState& st, std::unique_lock<std::mutex>& lock) {
  if (st.completed || !st.on_complete || !st.all_done()) return;
  st.completed = true;
  auto f = std::move(st.on_complete);
  st.on_complete = nullptr;
  lock.unlock();
  f(st);
}

class Observer : public infer::RequestObserver {
 public:
  Observer(std::shared_ptr<RequestState> st, int prompt_index) : st_(std::move(st)), base_(prompt_index * st_->n) {}
  void on_token(int index, TokenId token, const std::string& text, const infer::TokenLogprob* lp,
                const std::vector<infer::TokenLogprob>* top) override {
    const int c = base_ + index;
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(st_->m);
    if (c < 0 || c >= st_->total) return;
    if (Metrics* m = st_->metrics) {
      if (!st_->got_token[c]) m->ttft.observe(std::chrono::duration<double>(now - st_->start).count());
      else m->inter_token.observe(std::chrono::duration<double>(now - st_->last_token[c]).count());
      m->add_generated_token();
    }
    st_->got_token[c] = true;
    st_->last_token[c] = now;
    TokenEvent e;
    e.choice = c;
    e.token = token;
    e.text = text;
    if (lp && st_->want_logprobs) {
      e.has_logprob = true;
      e.logprob = *lp;
      if (top) e.top = *top;
    }
    if (st_->stream) {
      st_->events.push_back(std::move(e));
    } else {
      if (e.has_logprob) st_->choices[c].logprobs.push_back(std::move(e));
    }
    st_->cv.notify_all();
  }
  void on_finished(int index, const std::string& finish_reason, const std::string& text,
                   int64_t completion_tokens) override {
    const int c = base_ + index;
    std::unique_lock<std::mutex> lock(st_->m);
    if (c < 0 || c >= st_->total || st_->choices[c].done) return;
    auto& r = st_->choices[c];
    r.done = true;
    r.text = text;
    r.finish_reason = finish_reason;
    r.completion_tokens = completion_tokens;
    ++st_->finished;
    if (st_->stream) {
      TokenEvent e;
      e.choice = c;
      e.finished = true;
      e.finish_reason = finish_reason;
      st_->events.push_back(std::move(e));
    }
    st_->cv.notify_all();
    maybe_complete(*st_, lock);
  }
  void on_error(const std::string& message) override {
    std::unique_lock<std::mutex> lock(st_->m);
    if (st_->error.empty()) st_->error = message.empty() ? "generation failed" : message;
    st_->cv.notify_all();
    maybe_complete(*st_, lock);
  }

 private:
  std::shared_ptr<RequestState> st_;
  int base_;
};

}  // namespace

json logprobs_json(const ParsedRequest& r, const Tokenizer& tok, const std::vector<TokenEvent>& events) {
  if (r.top_logprobs < 0) return nullptr;
  if (r.endpoint == Endpoint::ChatCompletions) {
    json content = json::array();
    for (const auto& e : events) {
      const std::string t = token_text(tok, e.token);
      json top = json::array();
      for (const auto& alt : e.top) {
        const std::string at = token_text(tok, alt.token);
        top.push_back({{"token", at}, {"logprob", alt.logprob}, {"bytes", bytes_of(at)}});
      }
      content.push_back({{"token", t}, {"logprob", e.logprob.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t off = 0;
  for (const auto& e : events) {
    const std::string t = token_text(tok, e.token);
    tokens.push_back(t);
    lps.push_back(e.logprob.logprob);
    json top = json::object();
    for (const auto& alt : e.top) top[token_text(tok, alt.token)] = alt.logprob;
    tops.push_back(top);
    offsets.push_back(off);
    off += static_cast<int64_t>(t.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

std::variant<PreparedRequest, ApiError> prepare_request(const LoadedModel& model, ParsedRequest r) {
  const LoadedModel* l = &model;
  const Tokenizer& tok = *l->ckpt.model.tokenizer;
  const int64_t context = l->scheduler->context();
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  PreparedRequest p;
  auto& prompts = p.prompts;
  if (chat) {
    if (!l->chat_template)
      return api_error(400, "the model's chat template cannot be used: " + l->chat_template_error, "messages",
                       "unsupported_chat_template");
    std::string text;
    try {
      text = l->chat_template->apply(r.messages, true, l->ckpt.bos_token, l->ckpt.eos_token);
    } catch (const std::exception& e) {
      return api_error(400, std::string("the chat template failed: ") + e.what(), "messages", "chat_template_error");
    }
    EncodeOptions eo;
    eo.add_special = false;   // the template writes BOS itself where the model wants one
    eo.parse_special = true;  // its <|im_start|>-style markers are special tokens
    prompts.push_back(tok.encode(text, eo));
  } else {
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const Prompt& pr = r.prompts[i];
      if (pr.is_ids) {
        for (TokenId t : pr.ids)
          if (static_cast<size_t>(t) >= tok.vocab_size())
            return api_error(400, "'prompt': token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                      std::to_string(tok.vocab_size()) + ")", "prompt");
        prompts.push_back(pr.ids);
      } else {
        EncodeOptions eo;
        eo.add_special = true;
        prompts.push_back(tok.encode(pr.text, eo));
      }
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto& ids_i = prompts[i];
    if (ids_i.empty()) {
      if (tok.bos_id()) ids_i.push_back(*tok.bos_id());
      else if (tok.eos_id()) ids_i.push_back(*tok.eos_id());
      else return api_error(400, "the prompt is empty and the tokenizer has no BOS token to start from", chat ? "messages" : "prompt");
    }
    if (static_cast<int64_t>(ids_i.size()) >= context)
      return api_error(400, std::string(chat ? "the rendered messages are " : "the prompt") +
                                (prompts.size() > 1 ? " " + std::to_string(i) : "") + (chat ? "" : " is ") +
                                std::to_string(ids_i.size()) + " tokens; the context is " + std::to_string(context) +
                                " tokens (at least one must be left to generate)",
                       chat ? "messages" : "prompt", "context_length_exceeded");
    p.prompt_tokens += static_cast<int64_t>(ids_i.size());
  }
  if (r.max_tokens && *r.max_tokens >= context)
    return api_error(400, "'max_tokens' " + std::to_string(*r.max_tokens) + " does not fit the context of " +
                              std::to_string(context) + " tokens", "max_tokens");
  for (const auto& [id, bias] : r.logit_bias)
    if (static_cast<size_t>(id) >= tok.vocab_size())
      return api_error(400, "'logit_bias': token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(tok.vocab_size()) + ")", "logit_bias");
  try {
    p.grammar = grammar_for(r);
  } catch (const std::exception& e) {
    const char* param = r.format == OutputFormat::Regex ? "regex" : r.format == OutputFormat::Choices ? "choices" : "response_format";
    return api_error(400, e.what(), param, "unsupported_grammar");
  }
  p.r = std::move(r);
  return p;
}

std::shared_ptr<RequestState> make_request_state(const PreparedRequest& p, bool stream, Metrics* metrics) {
  auto st = std::make_shared<RequestState>();
  st->stream = stream;
  st->want_logprobs = p.r.top_logprobs >= 0;
  st->n = p.r.n;
  st->total = static_cast<int>(p.prompts.size()) * p.r.n;
  st->choices.resize(st->total);
  st->last_token.resize(st->total);
  st->got_token.assign(st->total, false);
  st->metrics = metrics;
  return st;
}

std::optional<ApiError> submit_prepared(LoadedModel& model, const PreparedRequest& p, uint64_t seed, int priority,
                                        int64_t max_tokens_limit, const std::shared_ptr<RequestState>& st) {
  LoadedModel* l = &model;
  const ParsedRequest& r = p.r;
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  const int64_t context = l->scheduler->context();
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    infer::SequenceRequest sr;
    sr.prompt = p.prompts[i];
    const int64_t room = context - static_cast<int64_t>(sr.prompt.size());
    const int64_t def = chat ? std::min<int64_t>(max_tokens_limit, room) : 16;
    sr.max_new_tokens = std::min<int64_t>(r.max_tokens.value_or(def), room);
    sr.n = r.n;
    // Each prompt of a list draws its own streams (seed + i*n + k), so prompts do not share samples.
    sr.seed = seed + static_cast<uint64_t>(i) * static_cast<uint64_t>(r.n);
    sr.sampling.temperature = r.temperature;
    sr.sampling.top_p = r.top_p;
    sr.presence_penalty = r.presence_penalty;
    sr.frequency_penalty = r.frequency_penalty;
    sr.logit_bias = r.logit_bias;
    sr.stop = r.stop;
    sr.eos_ids = l->eos_ids;
    if (chat) sr.eos_ids.insert(sr.eos_ids.end(), l->chat_stop_ids.begin(), l->chat_stop_ids.end());
    sr.top_logprobs = r.top_logprobs;
    sr.grammar = p.grammar;
    sr.priority = priority;
    try {
      const infer::RequestId id = l->scheduler->submit(std::move(sr), std::make_shared<Observer>(st, static_cast<int>(i)));
      std::lock_guard<std::mutex> lock(st->m);
      st->ids.push_back(id);
    } catch (const std::exception& e) {
      std::vector<infer::RequestId> submitted;
      {
        std::lock_guard<std::mutex> lock(st->m);
        submitted = st->ids;
      }
      for (auto id : submitted) l->scheduler->cancel(id);
      if (dynamic_cast<const infer::QueueFullError*>(&e))
        return api_error(429, std::string("the server is busy (queue full): ") + e.what(), "", "queue_full");
      if (dynamic_cast<const infer::DrainingError*>(&e)) return api_error(503, "the server is shutting down", "", "draining");
      if (dynamic_cast<const ValueError*>(&e)) return api_error(400, e.what());
      return api_error(500, e.what());
    }
  }
  if (st->metrics) st->metrics->add_prompt_tokens(static_cast<uint64_t>(p.prompt_tokens));
  return std::nullopt;
}

std::vector<infer::RequestId> execute_parsed(LoadedModel& model, ParsedRequest parsed, const ExecOptions& options,
                                             std::function<void(ExecResult)> done) {
  auto fail = [&](const ApiError& e) -> std::vector<infer::RequestId> {
    done(ExecResult{e.status, e.to_json()});
    return {};
  };
  if (parsed.stream) return fail(api_error(400, "'stream': true is not supported here (only on the HTTP endpoints)", "stream"));
  auto prepared = prepare_request(model, std::move(parsed));
  if (auto* e = std::get_if<ApiError>(&prepared)) return fail(*e);
  auto p = std::make_shared<PreparedRequest>(std::move(std::get<PreparedRequest>(prepared)));
  const bool chat = p->r.endpoint == Endpoint::ChatCompletions;
  const uint64_t seed = p->r.seed_given ? p->r.seed : options.default_seed ? *options.default_seed : random_seed();
  const std::string id = !options.response_id.empty() ? options.response_id : (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  const int64_t created_at = options.created != 0 ? options.created
                                                  : std::chrono::duration_cast<std::chrono::seconds>(
                                                        std::chrono::system_clock::now().time_since_epoch()).count();
  auto st = make_request_state(*p, false, options.metrics);
  LoadedModel* l = &model;
  // Set before submitting: the last choice may finish before submit_prepared returns. `done` is
  // shared with the refusal path below, which runs only while on_complete has not.
  auto done_ptr = std::make_shared<std::function<void(ExecResult)>>(std::move(done));
  st->on_complete = [p, l, id, created_at, done_ptr](RequestState& s) {
    ExecResult out;
    std::vector<infer::RequestId> to_cancel;
    {
      std::lock_guard<std::mutex> lock(s.m);
      if (!s.error.empty()) {
        to_cancel = s.ids;  // the other prompts of a failed request are not needed any more
        const ApiError e = api_error(500, "generation failed: " + s.error);
        out = ExecResult{e.status, e.to_json()};
      } else {
        const ParsedRequest& r = p->r;
        const Tokenizer& tok = *l->ckpt.model.tokenizer;
        const bool is_chat = r.endpoint == Endpoint::ChatCompletions;
        json choices = json::array();
        int64_t completion_tokens = 0;
        bool failed = false;
        for (int c = 0; c < s.total && !failed; ++c) {
          const auto& ch = s.choices[c];
          if (ch.finish_reason == "cancelled" || ch.finish_reason == "error") {
            const ApiError e = api_error(ch.finish_reason == "cancelled" ? 503 : 500, "generation " + ch.finish_reason);
            out = ExecResult{e.status, e.to_json()};
            failed = true;
            break;
          }
          completion_tokens += ch.completion_tokens;
          json lp = logprobs_json(r, tok, ch.logprobs);
          if (is_chat)
            choices.push_back({{"index", c}, {"message", {{"role", "assistant"}, {"content", ch.text}}}, {"logprobs", lp},
                               {"finish_reason", finish_for_api(ch.finish_reason)}});
          else
            choices.push_back({{"index", c}, {"text", ch.text}, {"logprobs", lp}, {"finish_reason", finish_for_api(ch.finish_reason)}});
        }
        if (!failed) {
          json body = {{"id", id},
                       {"object", is_chat ? "chat.completion" : "text_completion"},
                       {"created", created_at},
                       {"model", r.model},
                       {"choices", choices},
                       {"usage", {{"prompt_tokens", p->prompt_tokens}, {"completion_tokens", completion_tokens},
                                  {"total_tokens", p->prompt_tokens + completion_tokens}}}};
          if (is_chat) body["system_fingerprint"] = "corelm";
          out = ExecResult{200, std::move(body)};
        }
      }
    }
    for (auto rid : to_cancel) l->scheduler->cancel(rid);
    (*done_ptr)(std::move(out));
  };
  if (auto e = submit_prepared(model, *p, seed, options.priority, options.max_tokens_limit, st)) {
    bool call = false;
    {
      std::lock_guard<std::mutex> lock(st->m);
      if (!st->completed) {
        st->completed = true;
        st->on_complete = nullptr;
        call = true;
      }
    }
    if (call) (*done_ptr)(ExecResult{e->status, e->to_json()});
    return {};
  }
  std::lock_guard<std::mutex> lock(st->m);
  return st->ids;
}

std::vector<infer::RequestId> execute(LoadedModel& model, Endpoint endpoint, std::string_view body,
                                      const std::vector<std::string>& model_ids, const ExecOptions& options,
                                      std::function<void(ExecResult)> done) {
  auto parsed = parse_request(endpoint, body, options.limits, model_ids);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    done(ExecResult{e->status, e->to_json()});
    return {};
  }
  return execute_parsed(model, std::move(std::get<ParsedRequest>(parsed)), options, std::move(done));
}

ExecResult score(const LoadedModel& m, const ScoreRequest& r) {
  const Tokenizer& tok = *m.ckpt.model.tokenizer;
  const model::Decoder& dec = m.ckpt.model.decoder;
  const int64_t context = m.scheduler->context();
  const int64_t vocab = dec.config().vocab_size;
  EncodeOptions eo;
  eo.add_special = r.add_special;
  std::vector<std::vector<TokenId>> encoded;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const std::string param = r.inputs.size() == 1 ? "input" : "input[" + std::to_string(i) + "]";
    encoded.push_back(tok.encode(r.inputs[i], eo));
    const int64_t n = static_cast<int64_t>(encoded.back().size());
    if (n < 2)
      return {400, api_error(400, "'" + param + "' encodes to " + std::to_string(n) +
                                      " token(s); scoring needs at least two (the first predicts the second)", param)
                       .to_json()};
    if (n > context)
      return {400, api_error(400, "'" + param + "' is " + std::to_string(n) + " tokens; the context is " +
                                      std::to_string(context) + " tokens", param, "context_length_exceeded")
                       .to_json()};
  }
  // Chunks of positions through one cache row: the logits of a chunk are [1, T, V], never the
  // whole text's at once.
  constexpr int64_t kChunk = 256;
  nlohmann::json data = nlohmann::json::array();
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < encoded.size(); ++i) {
    const std::vector<TokenId>& ids = encoded[i];
    const int64_t n = static_cast<int64_t>(ids.size());
    model::KVCache cache = dec.make_cache(1, n);
    double total = 0;
    for (int64_t begin = 0; begin + 1 < n; begin += kChunk) {
      const int64_t len = std::min(kChunk, n - 1 - begin);  // the last token predicts nothing
      std::vector<int32_t> chunk(ids.begin() + begin, ids.begin() + begin + len);
      const Tensor logits = dec.forward_cached(Tensor::from_vector(chunk, {1, len}), cache, {0}, model::Logits::All)
                                .contiguous();
      const float* x = logits.data<float>();
      for (int64_t t = 0; t < len; ++t) {
        const float* row = x + t * vocab;
        float mx = -INFINITY;
        for (int64_t v = 0; v < vocab; ++v) mx = std::max(mx, row[v]);
        double sum = 0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
        total += static_cast<double>(row[ids[begin + t + 1]]) - (mx + std::log(sum));
      }
    }
    const int64_t count = n - 1;
    prompt_tokens += n;
    data.push_back({{"index", i},
                    {"object", "score"},
                    {"logprob", total},
                    {"tokens", count},
                    {"mean_logprob", total / static_cast<double>(count)},
                    {"perplexity", std::exp(-total / static_cast<double>(count))}});
  }
  return {200, {{"object", "list"}, {"model", r.model}, {"data", data},
                {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}}};
}

std::string model_of(std::string_view body) {
  const json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (!j.is_object()) return "";
  auto it = j.find("model");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace corelm::serve
