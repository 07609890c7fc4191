// Engine: prompt preparation and the three task heads over the decoder's KV-cache forward.
#include "pipeline/engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include <filesystem>

#include "corelm/error.h"

namespace corelm::pipeline {
namespace {

// Documents are padded up to a multiple of this many tokens: few distinct shapes (so batches
// fill up) at a bounded cost in padding.
constexpr int64_t kBucketStep = 16;

double log_sum_exp(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return m + std::log(s);
}

std::string join_labels(const std::vector<std::string>& labels) {
  std::string s;
  for (const auto& l : labels) s += (s.empty() ? "" : ",") + l;
  return s;
}

// A classification result from one score per label (log-likelihoods, or logits / temperature):
// r's probs (their softmax, max-shifted, in label order), label (the most probable, the first on
// ties) and margin (its probability minus the second's; 1 with one label). Returns the top index
// and its probability; the caller writes logprob, which the two scorings define differently.
std::pair<int64_t, double> write_label_probs(nlohmann::ordered_json& r, const std::vector<std::string>& labels,
                                             const std::vector<double>& scores) {
  const int64_t L = static_cast<int64_t>(scores.size());
  const double m = *std::max_element(scores.begin(), scores.end());
  double z = 0;
  for (double v : scores) z += std::exp(v - m);
  std::vector<double> p(static_cast<size_t>(L));
  for (int64_t j = 0; j < L; ++j) p[j] = std::exp(scores[j] - m) / z;
  std::vector<int64_t> order(static_cast<size_t>(L));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  nlohmann::ordered_json probs = nlohmann::ordered_json::object();
  for (int64_t j = 0; j < L; ++j) probs[labels[j]] = p[j];
  r["label"] = labels[order[0]];
  r["probs"] = std::move(probs);
  r["margin"] = L > 1 ? p[order[0]] - p[order[1]] : 1.0;
  return {order[0], p[order[0]]};
}

}  // namespace

void apply_model_task_defaults(TaskSpec& task, const std::string& model_path) {
  if (task.kind != TaskKind::Classify) return;
  const std::filesystem::path config = std::filesystem::path(model_path) / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config, ec)) return;
  model::ModelConfig c;
  try {
    c = model::ModelConfig::load(config.string());
  } catch (const Error&) {
    return;  // the model load names what is wrong with it
  }
  if (!c.has_classifier()) return;
  if (task.labels.empty()) task.labels = c.labels;
  if (task.template_text.empty()) task.template_text = c.classifier_template.empty() ? "{text}" : c.classifier_template;
}

std::vector<int64_t> head_label_index(const std::vector<std::string>& task_labels,
                                      const std::vector<std::string>& head_labels) {
  std::vector<int64_t> index;
  for (const auto& l : task_labels) {
    const auto it = std::find(head_labels.begin(), head_labels.end(), l);
    CORELM_CHECK(it != head_labels.end(), ValueError, "--labels (", join_labels(task_labels),
                 ") do not match the model's classification head (", join_labels(head_labels), "): '", l,
                 "' is not one of its labels; give a subset of the head's labels, in any order, or leave --labels "
                 "out to use them all");
    index.push_back(it - head_labels.begin());
  }
  return index;
}

Engine::Engine(const model::Decoder& decoder, const Tokenizer& tokenizer, TaskSpec spec, int64_t max_logits_floats)
    : decoder_(decoder), tok_(tokenizer), spec_(std::move(spec)), max_logits_floats_(max_logits_floats) {
  spec_.validate();
  const auto& cfg = decoder_.config();
  vocab_ = cfg.vocab_size;
  tok_vocab_ = std::min<int64_t>(vocab_, static_cast<int64_t>(tok_.vocab_size()));
  ctx_ = cfg.max_position_embeddings;
  if (spec_.max_context > 0) ctx_ = std::min(ctx_, spec_.max_context);
  if (spec_.kind == TaskKind::Classify && cfg.has_classifier() && spec_.template_text.empty())
    spec_.template_text = cfg.classifier_template.empty() ? "{text}" : cfg.classifier_template;
  const std::string tmpl = spec_.effective_template();
  const size_t at = tmpl.find("{text}");
  prefix_text_ = tmpl.substr(0, at);
  suffix_text_ = tmpl.substr(at + 6);

  head_ = spec_.kind == TaskKind::Classify && cfg.has_classifier();
  if (head_) {
    head_index_ = head_label_index(spec_.labels, cfg.labels);
    budget_ = ctx_;
  } else if (spec_.kind == TaskKind::Classify) {
    for (const auto& label : spec_.labels) {
      std::vector<TokenId> t = tok_.encode(spec_.label_prefix + label);
      if (spec_.label_eos && tok_.eos_id()) t.push_back(*tok_.eos_id());
      CORELM_CHECK(!t.empty(), ValueError, "--labels: label '", label, "' encodes to no tokens");
      label_len_ = std::max<int64_t>(label_len_, static_cast<int64_t>(t.size()));
      label_tokens_.push_back(std::move(t));
    }
    budget_ = ctx_ - label_len_;
  } else if (spec_.kind == TaskKind::Extract) {
    budget_ = ctx_ - spec_.max_tokens;
    try {
      if (spec_.regex) grammar_ = infer::Grammar::regex(*spec_.regex);
      else if (!spec_.choices.empty()) grammar_ = infer::Grammar::choices(spec_.choices);
    } catch (const ValueError& e) {
      throw ValueError(std::string("--") + e.what());  // "--regex: ..." names the option
    }
    if (grammar_) constraint_.emplace(grammar_, tok_, std::vector<TokenId>{});
  } else {
    budget_ = ctx_;
  }
  EncodeOptions eo;
  eo.add_special = spec_.add_special;
  const int64_t template_tokens = static_cast<int64_t>(tok_.encode(prefix_text_ + suffix_text_, eo).size());
  // The advice names only options this task has: --max-tokens is extract's, labels classify's.
  const char* advice = "raise --max-context or shorten --template";
  if (spec_.kind == TaskKind::Classify) advice = "raise --max-context, shorten --template or --labels";
  if (spec_.kind == TaskKind::Extract) advice = "raise --max-context, shorten --template or lower --max-tokens";
  CORELM_CHECK(budget_ > template_tokens, ValueError, "the context of ", ctx_, " tokens leaves ", budget_,
               " for the prompt, but the template alone takes ", template_tokens, " (", advice,
               "; --max-context is at most the model's max_position_embeddings, ", cfg.max_position_embeddings, ")");

  // The template's prefix is run once; each document copies its keys/values.
  prefix_ = tok_.encode(prefix_text_, eo);
  if (!prefix_.empty()) {
    const int64_t P = static_cast<int64_t>(prefix_.size());
    prefix_cache_ = std::make_unique<model::KVCache>(decoder_.make_cache(1, P));
    prefix_logits_.assign(static_cast<size_t>(P * vocab_), 0.0f);
    forward({prefix_}, *prefix_cache_, {0},
            [&](size_t, const float* logits) { std::copy_n(logits, P * vocab_, prefix_logits_.begin()); });
    if (head_ && cfg.classifier_pooling == "mean") {
      model::KVCache scratch = decoder_.make_cache(1, P);
      std::vector<int32_t> flat(prefix_.begin(), prefix_.end());
      const Tensor h = decoder_.forward_cached(Tensor::from_vector(flat, {1, P}), scratch, {0}, model::Logits::None)
                           .contiguous();
      prefix_hidden_.assign(h.data<float>(), h.data<float>() + h.numel());
    }
  }
  set_batch(1);
}

Engine::~Engine() = default;

void Engine::set_batch(int64_t batch) {
  CORELM_CHECK(batch >= 1, ValueError, "--batch must be at least 1, got ", batch);
  batch_ = batch;
  cache_.reset();
  // The cache starts small and grows to what the longest batch so far reaches (ensure_cache):
  // sizing it by the model's whole context cost rows x context x layers of memory up front
  // (gigabytes for a long-context model) whatever the documents' lengths.
  ensure_cache(std::min<int64_t>(ctx_, 256) + kBucketStep);
}

void Engine::ensure_cache(int64_t positions) {
  const int64_t limit = ctx_ + kBucketStep;
  positions = std::min(positions, limit);
  if (cache_ && cache_->capacity() >= positions) return;
  const int64_t rows =
      spec_.kind == TaskKind::Classify && !head_ ? batch_ * static_cast<int64_t>(label_tokens_.size()) : batch_;
  // Grow geometrically so a corpus of slowly rising lengths reallocates only a few times.
  const int64_t capacity = cache_ ? std::min(limit, std::max(positions, 2 * cache_->capacity())) : positions;
  cache_.reset();
  cache_ = std::make_unique<model::KVCache>(decoder_.make_cache(rows, capacity));
}

std::optional<PreparedDoc> Engine::prepare(const std::string& text, std::string& error) const {
  EncodeOptions eo;
  eo.add_special = spec_.add_special;
  PreparedDoc doc;
  doc.tokens = tok_.encode(prefix_text_ + text + suffix_text_, eo);
  if (static_cast<int64_t>(doc.tokens.size()) > budget_) {
    if (spec_.truncate == Truncate::Error) {
      error = "document has " + std::to_string(doc.tokens.size()) + " prompt tokens; the context allows " +
              std::to_string(budget_) + " (--truncate error)";
      return std::nullopt;
    }
    // Cut the document's own tokens (never the template), then re-encode the prompt: token counts
    // can shift by a few at the cut, so shrink until it fits.
    std::vector<TokenId> body = tok_.encode(text);
    int64_t keep = static_cast<int64_t>(body.size()) - (static_cast<int64_t>(doc.tokens.size()) - budget_);
    for (int attempt = 0;; ++attempt) {
      keep = std::max<int64_t>(0, keep);
      std::span<const TokenId> kept = spec_.truncate == Truncate::Head
                                          ? std::span<const TokenId>(body.data(), keep)
                                          : std::span<const TokenId>(body.data() + body.size() - keep, keep);
      doc.tokens = tok_.encode(prefix_text_ + tok_.decode(kept) + suffix_text_, eo);
      const int64_t over = static_cast<int64_t>(doc.tokens.size()) - budget_;
      if (over <= 0) break;
      CORELM_CHECK(keep > 0 && attempt < 64, ValueError, "cannot truncate the document to fit the context");
      keep -= std::max<int64_t>(1, over);
    }
    doc.truncated = true;
  }
  if (doc.tokens.empty()) {
    error = "the prompt encodes to no tokens";
    return std::nullopt;
  }
  if (spec_.kind == TaskKind::Score && doc.tokens.size() < 2) {
    error = "score needs at least 2 tokens, the document has " + std::to_string(doc.tokens.size());
    return std::nullopt;
  }
  // Reuse the prefix's KV for the tokens the prompt shares with it; at least one token of the
  // prompt is left to run so its last position yields logits.
  size_t common = 0;
  while (common < prefix_.size() && common < doc.tokens.size() && prefix_[common] == doc.tokens[common]) ++common;
  doc.reuse = static_cast<int64_t>(std::min(common, doc.tokens.size() - 1));
  // A ring or recurrent state holds the whole history, not per-position keys: no partial reuse.
  if (!decoder_.config().all_full_attention()) doc.reuse = 0;
  return doc;
}

int64_t Engine::bucket(const PreparedDoc& doc) const {
  const int64_t n = static_cast<int64_t>(doc.tokens.size()) - doc.reuse - hold_back();
  // Sliding-window rings and linear-attention states cannot forget padding (a cache row is only
  // ever cut back to 0), so such models run every prompt at its exact length: batches then group
  // prompts of one length.
  if (!decoder_.config().all_full_attention()) return n;
  return (n + kBucketStep - 1) / kBucketStep * kBucketStep;
}

// The single place the model runs. Rows are split into several calls when their logits would
// exceed the memory bound; rows are independent, so this changes no result. Calls whose logits
// nobody reads skip the LM head (Logits::None).
void Engine::forward(const std::vector<std::vector<TokenId>>& ids, model::KVCache& cache,
                     const std::vector<int64_t>& rows, const std::function<void(size_t, const float*)>& on_row_logits) {
  const int64_t T = static_cast<int64_t>(ids.at(0).size());
  const model::Logits want = on_row_logits ? model::Logits::All : model::Logits::None;
  const size_t per_call = on_row_logits ? static_cast<size_t>(std::max<int64_t>(
                                              1, max_logits_floats_ / std::max<int64_t>(1, T * vocab_)))
                                        : ids.size();
  for (size_t b0 = 0; b0 < ids.size(); b0 += per_call) {
    const size_t b1 = std::min(ids.size(), b0 + per_call);
    std::vector<int32_t> flat;
    flat.reserve((b1 - b0) * T);
    for (size_t b = b0; b < b1; ++b) flat.insert(flat.end(), ids[b].begin(), ids[b].end());
    std::vector<int64_t> sub(rows.begin() + b0, rows.begin() + b1);
    Tensor out = decoder_.forward_cached(Tensor::from_vector(flat, {static_cast<int64_t>(b1 - b0), T}), cache, sub, want);
    if (!on_row_logits) continue;
    const Tensor logits = out.contiguous();
    const float* p = logits.data<float>();
    for (size_t b = b0; b < b1; ++b) on_row_logits(b, p + (b - b0) * T * vocab_);
  }
}

void Engine::copy_kv(model::KVCache& src, int64_t src_row, int64_t dst_row, int64_t n) {
  if (n == 0) return;
  cache_->copy_from(src, src_row, dst_row, n);  // bytes as stored, whatever the cache types (no length set)
}

// Puts each document's reused prefix into its row (length = reuse).
void Engine::start_rows(const std::vector<PreparedDoc*>& docs, const std::vector<int64_t>& rows) {
  for (size_t i = 0; i < docs.size(); ++i) {
    if (docs[i]->reuse > 0) copy_kv(*prefix_cache_, 0, rows[i], docs[i]->reuse);
    cache_->set_length(rows[i], docs[i]->reuse);
  }
}

// The prompt minus its last token runs padded to the bucket length (its logits are not needed:
// the place for Logits::None on the fast path); each row is then cut back to its real length and
// the last tokens run as one [B, 1] step whose logits are the ones wanted. Padding never reaches
// a position whose logits are used, and depends on the document alone.
void Engine::prefill_last(const std::vector<PreparedDoc*>& docs, const std::vector<int64_t>& rows,
                          const std::function<void(size_t, const float*)>& on_last_logits) {
  start_rows(docs, rows);
  const int64_t T = bucket(*docs[0]);
  if (T > 0) forward(padded_doc_parts(docs, T, 1), *cache_, rows, {});
  std::vector<std::vector<TokenId>> last;
  for (size_t i = 0; i < docs.size(); ++i) {
    cache_->set_length(rows[i], static_cast<int64_t>(docs[i]->tokens.size()) - 1);
    last.push_back({docs[i]->tokens.back()});
  }
  forward(last, *cache_, rows, on_last_logits);
}

void Engine::run_batch(const std::vector<PreparedDoc*>& docs) {
  if (docs.empty()) return;
  CORELM_CHECK(static_cast<int64_t>(docs.size()) <= batch_, ValueError, "Engine::run_batch: ", docs.size(),
               " documents for a batch of ", batch_);
  int64_t need = 0;
  for (PreparedDoc* d : docs) {
    CORELM_CHECK(bucket(*d) == bucket(*docs[0]), ValueError, "Engine::run_batch: documents of different buckets");
    need = std::max(need, d->reuse + bucket(*d) + hold_back());
  }
  // Positions the rows reach: the padded prompt, then the label tokens or generated tokens.
  need += (spec_.kind == TaskKind::Classify ? label_len_ : spec_.kind == TaskKind::Extract ? spec_.max_tokens : 0);
  ensure_cache(need + kBucketStep);
  switch (spec_.kind) {
    case TaskKind::Classify: head_ ? classify_head(docs) : classify(docs); break;
    case TaskKind::Extract: extract(docs); break;
    case TaskKind::Score: score(docs); break;
  }
  for (PreparedDoc* d : docs)
    if (d->truncated) d->result["truncated"] = true;
}

// The padded document part of each prompt (all of one bucket length).
std::vector<std::vector<TokenId>> padded_doc_parts(const std::vector<PreparedDoc*>& docs, int64_t T, int64_t hold_back) {
  std::vector<std::vector<TokenId>> ids;
  for (const PreparedDoc* d : docs) {
    std::vector<TokenId> part(d->tokens.begin() + d->reuse, d->tokens.end() - hold_back);
    part.resize(static_cast<size_t>(T), 0);
    ids.push_back(std::move(part));
  }
  return ids;
}

void Engine::classify(const std::vector<PreparedDoc*>& docs) {
  const int64_t L = static_cast<int64_t>(label_tokens_.size());
  std::vector<int64_t> doc_rows;
  for (size_t i = 0; i < docs.size(); ++i) doc_rows.push_back(static_cast<int64_t>(i) * L);
  // loglik[i][j]: log-likelihood of label j after document i. The document's last position
  // scores every label's first token.
  std::vector<std::vector<double>> loglik(docs.size(), std::vector<double>(L, 0.0));
  prefill_last(docs, doc_rows, [&](size_t i, const float* row) {
    const double lse = log_sum_exp(row, vocab_);
    for (int64_t j = 0; j < L; ++j) loglik[i][j] = row[label_tokens_[j][0]] - lse;
  });
  if (label_len_ > 1) {
    // Each label continues from a copy of the document's keys/values in its own row.
    std::vector<std::vector<TokenId>> ids;
    std::vector<int64_t> rows;
    for (size_t i = 0; i < docs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(docs[i]->tokens.size());
      for (int64_t j = 0; j < L; ++j) {
        const int64_t r = doc_rows[i] + j;
        if (j > 0) {
          cache_->set_length(r, 0);  // a row of the last batch may be longer; 0 is always allowed
          copy_kv(*cache_, doc_rows[i], r, n);
        }
        cache_->set_length(r, n);
        std::vector<TokenId> in(label_tokens_[j].begin(), label_tokens_[j].end() - 1);
        in.resize(static_cast<size_t>(label_len_ - 1), 0);
        ids.push_back(std::move(in));
        rows.push_back(r);
      }
    }
    forward(ids, *cache_, rows, [&](size_t k, const float* logits) {
      const size_t i = k / L, j = k % L;
      const auto& lt = label_tokens_[j];
      for (size_t t = 1; t < lt.size(); ++t) {
        const float* row = logits + (t - 1) * vocab_;
        loglik[i][j] += row[lt[t]] - log_sum_exp(row, vocab_);
      }
    });
  }
  for (size_t i = 0; i < docs.size(); ++i) {
    auto& r = docs[i]->result;
    const int64_t top = write_label_probs(r, spec_.labels, loglik[i]).first;
    r["logprob"] = loglik[i][top];
  }
}

void Engine::classify_head(const std::vector<PreparedDoc*>& docs) {
  const auto& cfg = decoder_.config();
  const int64_t H = cfg.hidden_size, L = static_cast<int64_t>(head_index_.size());
  const bool mean = cfg.classifier_pooling == "mean";
  const double temperature = cfg.classifier_temperature;
  const Tensor w = decoder_.classifier_weight().contiguous();
  const float* W = w.data<float>();
  const int64_t T = bucket(*docs[0]);
  std::vector<int64_t> rows(docs.size());
  std::iota(rows.begin(), rows.end(), 0);
  start_rows(docs, rows);
  // Padding sits after each document's last token: under the causal mask it never reaches the
  // positions pooled, so a row's result depends on its document alone.
  const std::vector<std::vector<TokenId>> ids = padded_doc_parts(docs, T, 0);
  std::vector<int32_t> flat;
  for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
  const Tensor hidden = decoder_.forward_cached(Tensor::from_vector(flat, {static_cast<int64_t>(docs.size()), T}),
                                                *cache_, rows, model::Logits::None)
                            .contiguous();
  const float* hs = hidden.data<float>();
  std::vector<double> pooled(static_cast<size_t>(H));
  for (size_t i = 0; i < docs.size(); ++i) {
    const PreparedDoc& d = *docs[i];
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    const float* row = hs + static_cast<int64_t>(i) * T * H;
    if (mean) {
      std::fill(pooled.begin(), pooled.end(), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        const float* h = t < d.reuse ? prefix_hidden_.data() + t * H : row + (t - d.reuse) * H;
        for (int64_t k = 0; k < H; ++k) pooled[k] += h[k];
      }
      for (double& v : pooled) v /= static_cast<double>(n);
    } else {
      const float* h = row + (n - 1 - d.reuse) * H;
      for (int64_t k = 0; k < H; ++k) pooled[k] = h[k];
    }
    std::vector<double> z(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) {
      const float* wr = W + head_index_[j] * H;
      double acc = 0;
      for (int64_t k = 0; k < H; ++k) acc += pooled[k] * wr[k];
      z[j] = acc / temperature;
    }
    auto& r = docs[i]->result;
    const double top_p = write_label_probs(r, spec_.labels, z).second;
    r["logprob"] = std::log(top_p);
  }
}

void Engine::score(const std::vector<PreparedDoc*>& docs) {
  const int64_t T = bucket(*docs[0]);
  std::vector<int64_t> rows(docs.size());
  std::iota(rows.begin(), rows.end(), 0);
  start_rows(docs, rows);
  forward(padded_doc_parts(docs, T, 0), *cache_, rows, [&](size_t i, const float* logits) {
    const PreparedDoc& d = *docs[i];
    const int64_t n = static_cast<int64_t>(d.tokens.size()), reuse = d.reuse;
    double total = 0;
    // Position t predicts token t + 1; positions before `reuse` come from the prefix's logits.
    for (int64_t t = 0; t + 1 < n; ++t) {
      const float* row = t < reuse ? prefix_logits_.data() + t * vocab_ : logits + (t - reuse) * vocab_;
      total += row[d.tokens[t + 1]] - log_sum_exp(row, vocab_);
    }
    const int64_t count = n - 1;
    auto& r = docs[i]->result;
    r["mean_logprob"] = total / count;
    r["perplexity"] = std::exp(-total / count);
    r["tokens"] = count;
  });
}

}  // namespace corelm::pipeline
