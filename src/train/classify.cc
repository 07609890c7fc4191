// Sequence classification with the head (score.weight over the pooled final hidden state):
// records, samplers, the objective the trainer runs, and temperature scaling after training.
// The loop itself is train()'s (AdamW, schedule, checkpoints, locks): this file only supplies
// the loss and the evaluation through train::Objective.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/hash.h"
#include "corelm/ops.h"
#include "corelm/safetensors.h"
#include "corelm/train.h"
#include "corelm/utf8.h"

#include "jsonl_records.h"

namespace corelm::train {
namespace fs = std::filesystem;
namespace {

constexpr int kEceBins = 15;  // as corelm eval-task

std::string label_set(const std::vector<std::string>& labels) {
  std::string s;
  for (const auto& l : labels) s += (s.empty() ? "" : ",") + l;
  return s;
}

// log-softmax of logits / T for one row (double, max-shifted).
std::vector<double> log_probs(const std::vector<float>& z, double temperature) {
  double m = -INFINITY;
  for (float v : z) m = std::max(m, double(v) / temperature);
  double s = 0;
  for (float v : z) s += std::exp(double(v) / temperature - m);
  const double lse = m + std::log(s);
  std::vector<double> out(z.size());
  for (size_t j = 0; j < z.size(); ++j) out[j] = double(z[j]) / temperature - lse;
  return out;
}

}  // namespace

namespace {
// The template's text around {text}; ValueError for a bad template, too few labels or max_tokens.
std::pair<std::string, std::string> template_parts(const ClassifyDataOptions& o) {
  CORELM_CHECK(o.labels.size() >= 2, ValueError, "classify: --labels needs at least two labels, got ",
               o.labels.size(), " (", label_set(o.labels), ")");
  const size_t at = o.template_text.find("{text}");
  CORELM_CHECK(at != std::string::npos && o.template_text.find("{text}", at + 1) == std::string::npos, ValueError,
               "classify: --template must hold {text} exactly once: '", o.template_text, "'");
  CORELM_CHECK(o.max_tokens >= 1, ValueError, "classify: --seq must be positive, got ", o.max_tokens);
  return {o.template_text.substr(0, at), o.template_text.substr(at + 6)};
}
}  // namespace

namespace {
// The teacher's distribution of one record (ClassifyDataOptions::teacher_field), in label order.
std::vector<float> read_teacher(const nlohmann::json& j, const ClassifyDataOptions& o, const std::string& where) {
  const std::string field = "field \"" + o.teacher_field + "\" (--teacher-field)";
  CORELM_CHECK(j.contains(o.teacher_field), FormatError, where, ": missing ", field);
  const nlohmann::json& v = j[o.teacher_field];
  const size_t L = o.labels.size();
  std::vector<double> p(L, 0);
  std::vector<bool> given(L, false);
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      const auto it = std::find(o.labels.begin(), o.labels.end(), key);
      CORELM_CHECK(it != o.labels.end(), FormatError, where, ": ", field, " names label '", escape_invalid_utf8(key),
                   "', not one of --labels (", label_set(o.labels), ")");
      CORELM_CHECK(value.is_number(), FormatError, where, ": ", field, ": the probability of '", key,
                   "' must be a number, got ", value.dump());
      p[static_cast<size_t>(it - o.labels.begin())] = value.get<double>();
      given[static_cast<size_t>(it - o.labels.begin())] = true;
    }
    for (size_t c = 0; c < L; ++c)
      CORELM_CHECK(given[c], FormatError, where, ": ", field, " has no probability for label '", o.labels[c], "'");
  } else if (v.is_array()) {
    CORELM_CHECK(v.size() == L, FormatError, where, ": ", field, " holds ", v.size(), " probabilities for ", L,
                 " labels (", label_set(o.labels), ")");
    for (size_t c = 0; c < L; ++c) {
      CORELM_CHECK(v[c].is_number(), FormatError, where, ": ", field, ": entry ", c, " must be a number, got ",
                   v[c].dump());
      p[c] = v[c].get<double>();
    }
  } else {
    throw FormatError(where + ": " + field + " must be an object {label: probability} or an array, got " + v.dump());
  }
  double sum = 0;
  for (size_t c = 0; c < L; ++c) {
    CORELM_CHECK(std::isfinite(p[c]) && p[c] >= 0, FormatError, where, ": ", field, ": the probability of '",
                 o.labels[c], "' must be finite and >= 0, got ", p[c]);
    sum += p[c];
  }
  CORELM_CHECK(std::abs(sum - 1) <= 1e-3, FormatError, where, ": ", field, ": the probabilities sum to ", sum,
               ", not 1");
  std::vector<float> out(L);
  for (size_t c = 0; c < L; ++c) out[c] = static_cast<float>(p[c] / sum);
  return out;
}
}  // namespace

std::vector<ClassifyText> read_classify_texts(const std::string& path, const ClassifyDataOptions& o) {
  template_parts(o);
  std::vector<ClassifyText> out;
  detail::for_each_jsonl_record(path, [&](const nlohmann::json& j, const std::string& where) {
    CORELM_CHECK(j.is_object(), FormatError, where, ": expected an object {\"", o.text_field, "\": ..., \"",
                 o.label_field, "\": ...}");
    CORELM_CHECK(j.contains(o.text_field) && j[o.text_field].is_string(), FormatError, where,
                 ": missing string field \"", o.text_field, "\" (--text-field)");
    CORELM_CHECK(j.contains(o.label_field), FormatError, where, ": missing field \"", o.label_field,
                 "\" (--label-field)");
    const nlohmann::json& lv = j[o.label_field];
    std::string label;
    if (lv.is_string()) label = lv.get<std::string>();
    else if (lv.is_number_integer()) label = std::to_string(lv.get<int64_t>());
    else throw FormatError(where + ": field \"" + o.label_field + "\" must be a string or an integer, got " + lv.dump());
    const auto it = std::find(o.labels.begin(), o.labels.end(), label);
    CORELM_CHECK(it != o.labels.end(), FormatError, where, ": label '", escape_invalid_utf8(label),
                 "' is not one of --labels (", label_set(o.labels), ")");
    ClassifyText t{j[o.text_field].get<std::string>(), it - o.labels.begin(), where, {}};
    if (!o.teacher_field.empty()) t.teacher = read_teacher(j, o, where);
    out.push_back(std::move(t));
  });
  CORELM_CHECK(!out.empty(), FormatError, path, ": no records (empty data)");
  return out;
}

std::vector<ClassifyRecord> encode_classify_records(const std::vector<ClassifyText>& texts, const Tokenizer& tokenizer,
                                                    const ClassifyDataOptions& o) {
  const auto [prefix, suffix] = template_parts(o);
  std::vector<ClassifyRecord> out;
  out.reserve(texts.size());
  for (const ClassifyText& t : texts) {
    ClassifyRecord r;
    r.label = t.label;
    r.teacher = t.teacher;
    r.ids = tokenizer.encode(prefix + t.text + suffix);
    if (r.ids.empty() && tokenizer.eos_id()) r.ids.push_back(*tokenizer.eos_id());
    CORELM_CHECK(!r.ids.empty(), FormatError, t.where, ": the text encodes to no tokens");
    if (static_cast<int64_t>(r.ids.size()) > o.max_tokens) r.ids.resize(static_cast<size_t>(o.max_tokens));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<ClassifyRecord> load_classify_records(const std::string& path, const Tokenizer& tokenizer,
                                                  const ClassifyDataOptions& o) {
  return encode_classify_records(read_classify_texts(path, o), tokenizer, o);
}

std::vector<int64_t> label_counts(const std::vector<ClassifyRecord>& records, size_t num_labels) {
  std::vector<int64_t> n(num_labels, 0);
  for (const auto& r : records) ++n.at(static_cast<size_t>(r.label));
  return n;
}

void stratified_split(const std::vector<ClassifyRecord>& all, double fraction, std::vector<ClassifyRecord>& train,
                      std::vector<ClassifyRecord>& dev, size_t num_labels) {
  CORELM_CHECK(std::isfinite(fraction) && fraction > 0 && fraction < 1, ValueError,
               "classify: --val-fraction must be in (0, 1) (or give --dev FILE), got ", fraction);
  const std::vector<int64_t> counts = label_counts(all, num_labels);
  std::vector<int64_t> n_dev(num_labels), seen(num_labels, 0);
  for (size_t c = 0; c < num_labels; ++c) {
    n_dev[c] = static_cast<int64_t>(std::llround(fraction * static_cast<double>(counts[c])));
    if (counts[c] >= 2) n_dev[c] = std::clamp<int64_t>(n_dev[c], 1, counts[c] - 1);
    else n_dev[c] = 0;
  }
  train.clear();
  dev.clear();
  for (const auto& r : all) {
    const size_t c = static_cast<size_t>(r.label);
    (seen[c]++ >= counts[c] - n_dev[c] ? dev : train).push_back(r);
  }
}

Batch make_classify_batch(const std::vector<const ClassifyRecord*>& rows, TokenId pad_id) {
  CORELM_CHECK(!rows.empty(), ValueError, "make_classify_batch: empty batch");
  size_t T = 1;
  for (const auto* r : rows) T = std::max(T, r->ids.size());
  const int64_t B = static_cast<int64_t>(rows.size());
  std::vector<int64_t> ids(static_cast<size_t>(B) * T, pad_id), labels, lengths;
  for (int64_t b = 0; b < B; ++b) {
    std::copy(rows[b]->ids.begin(), rows[b]->ids.end(), ids.begin() + b * static_cast<int64_t>(T));
    labels.push_back(rows[b]->label);
    lengths.push_back(static_cast<int64_t>(rows[b]->ids.size()));
  }
  Batch out{Tensor::from_vector(ids, {B, static_cast<int64_t>(T)}), Tensor::from_vector(labels, {B})};
  out.lengths = Tensor::from_vector(lengths, {B});
  // Every row carries a teacher distribution of the first row's length, or none does.
  const size_t L = rows[0]->teacher.size();
  std::vector<float> soft;
  soft.reserve(static_cast<size_t>(B) * L);
  for (const auto* r : rows) {
    CORELM_CHECK(r->teacher.size() == L, ValueError, "make_classify_batch: rows with and without teacher "
                 "distributions (or of different lengths) in one batch");
    soft.insert(soft.end(), r->teacher.begin(), r->teacher.end());
  }
  if (L > 0) out.soft_targets = Tensor::from_vector(soft, {B, static_cast<int64_t>(L)});
  return out;
}

ClassifySampler::ClassifySampler(const std::vector<ClassifyRecord>& records, size_t num_labels, bool balanced,
                                 TokenId pad_id, uint64_t seed)
    : records_(records), by_class_(num_labels), balanced_(balanced), pad_(pad_id), seed_(seed), gen_(seed) {
  CORELM_CHECK(!records.empty(), ValueError, "classify: no training records");
  for (size_t i = 0; i < records.size(); ++i) by_class_.at(static_cast<size_t>(records[i].label)).push_back(i);
}

// Epoch order: the permutation of epoch e is a pure function of (seed, e), so the position is
// just the number of rows drawn (resume needs nothing else).
size_t ClassifySampler::record_at(int64_t position) {
  const int64_t n = static_cast<int64_t>(records_.size());
  const int64_t epoch = position / n;
  if (epoch != perm_epoch_) {
    perm_.resize(records_.size());
    for (size_t i = 0; i < perm_.size(); ++i) perm_[i] = i;
    Generator g(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
    for (size_t i = perm_.size() - 1; i > 0; --i) std::swap(perm_[i], perm_[g.below(i + 1)]);
    perm_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(position % n)];
}

Batch ClassifySampler::next(int64_t batch, int64_t /*seq*/) {
  std::vector<const ClassifyRecord*> rows;
  std::vector<size_t> present;
  for (size_t c = 0; c < by_class_.size(); ++c)
    if (!by_class_[c].empty()) present.push_back(c);
  for (int64_t b = 0; b < batch; ++b) {
    if (balanced_) {
      const auto& cls = by_class_[present[gen_.below(present.size())]];
      rows.push_back(&records_[cls[gen_.below(cls.size())]]);
    } else {
      rows.push_back(&records_[record_at(drawn_ + b)]);
    }
  }
  drawn_ += batch;
  return make_classify_batch(rows, pad_);
}

Tensor classifier_logits(const model::Decoder& model, const Batch& batch, bool train_body, float dropout,
                         Generator* gen) {
  const Tensor& w = model.classifier_weight();
  const int64_t B = batch.ids.size(0), T = batch.ids.size(1);
  CORELM_CHECK(batch.lengths.defined() && batch.lengths.numel() == B, ValueError,
               "classifier_logits: the batch has no row lengths");
  Tensor hidden;
  if (train_body) {
    hidden = model.forward_hidden(batch.ids);
  } else {
    autograd::NoGradGuard no_grad;
    hidden = model.forward_hidden(batch.ids).detach();
  }
  const int64_t H = hidden.size(-1);
  // Pooling as one product with a constant [B, B*T] matrix: a one-hot row (the last real token)
  // or 1/len over the real tokens; its backward is the matching scatter into the hidden states.
  const std::vector<int64_t> len = batch.lengths.to_int_vector();
  std::vector<float> pool(static_cast<size_t>(B * B * T), 0.0f);
  const bool mean = model.config().classifier_pooling == "mean";
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = std::clamp<int64_t>(len[b], 1, T);
    float* row = pool.data() + b * B * T + b * T;
    if (mean)
      for (int64_t t = 0; t < n; ++t) row[t] = 1.0f / static_cast<float>(n);
    else
      row[n - 1] = 1.0f;
  }
  Tensor pooled = ops::matmul(Tensor::from_vector(pool, {B, B * T}), ops::reshape(hidden, {B * T, H}));
  if (dropout > 0) {
    CORELM_CHECK(gen != nullptr, ValueError, "classifier_logits: dropout needs a generator");
    pooled = ops::dropout(pooled, dropout, true, *gen);
  }
  return ops::linear(pooled, w);
}

std::vector<std::vector<float>> classify_logits(const model::Decoder& model, const std::vector<ClassifyRecord>& records,
                                                TokenId pad_id, int64_t batch) {
  autograd::NoGradGuard no_grad;
  std::vector<std::vector<float>> out;
  out.reserve(records.size());
  // Similar lengths together: less padding (each row's result does not depend on its batch).
  std::vector<size_t> order(records.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return records[a].ids.size() < records[b].ids.size(); });
  out.assign(records.size(), {});
  for (size_t i = 0; i < order.size(); i += static_cast<size_t>(batch)) {
    std::vector<const ClassifyRecord*> rows;
    for (size_t k = i; k < std::min(order.size(), i + static_cast<size_t>(batch)); ++k) rows.push_back(&records[order[k]]);
    const Tensor logits = classifier_logits(model, make_classify_batch(rows, pad_id), false).contiguous();
    const int64_t L = logits.size(1);
    const float* p = logits.data<float>();
    for (size_t r = 0; r < rows.size(); ++r) out[order[i + r]].assign(p + r * L, p + (r + 1) * L);
  }
  return out;
}

CalibrationStats calibration_stats(const std::vector<std::vector<float>>& logits, const std::vector<int64_t>& labels,
                                   double temperature) {
  CORELM_CHECK(logits.size() == labels.size() && !logits.empty(), ValueError, "calibration_stats: ", logits.size(),
               " rows of logits for ", labels.size(), " labels");
  CalibrationStats s;
  std::vector<double> bin_conf(kEceBins, 0), bin_correct(kEceBins, 0), bin_n(kEceBins, 0);
  for (size_t i = 0; i < logits.size(); ++i) {
    const std::vector<double> lp = log_probs(logits[i], temperature);
    const size_t best = static_cast<size_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    const bool correct = static_cast<int64_t>(best) == labels[i];
    const double conf = std::exp(lp[best]);
    s.accuracy += correct;
    s.nll -= lp[static_cast<size_t>(labels[i])];
    const int b = std::clamp(static_cast<int>(std::ceil(conf * kEceBins)) - 1, 0, kEceBins - 1);
    bin_conf[b] += conf;
    bin_correct[b] += correct;
    bin_n[b] += 1;
  }
  const double n = static_cast<double>(logits.size());
  for (int b = 0; b < kEceBins; ++b)
    if (bin_n[b] > 0) s.ece += bin_n[b] / n * std::abs(bin_correct[b] / bin_n[b] - bin_conf[b] / bin_n[b]);
  s.accuracy /= n;
  s.nll /= n;
  return s;
}

double fit_temperature(const std::vector<std::vector<float>>& logits, const std::vector<int64_t>& labels) {
  auto nll = [&](double log_t) { return calibration_stats(logits, labels, std::exp(log_t)).nll; };
  // The NLL is smooth and unimodal in log T for a fixed set of logits; 60 golden-section steps
  // shrink [log 1/20, log 20] to ~1e-12.
  double a = std::log(0.05), b = std::log(20.0);
  const double g = (std::sqrt(5.0) - 1) / 2;
  double c = b - g * (b - a), d = a + g * (b - a), fc = nll(c), fd = nll(d);
  for (int i = 0; i < 60; ++i) {
    if (fc < fd) {
      b = d, d = c, fd = fc;
      c = b - g * (b - a), fc = nll(c);
    } else {
      a = c, c = d, fc = fd;
      d = a + g * (b - a), fd = nll(d);
    }
  }
  return std::exp((a + b) / 2);
}

ClassifyObjective::ClassifyObjective(const std::vector<ClassifyRecord>& dev, const ClassifyTrainOptions& options)
    : dev_(dev), opt_(options) {
  CORELM_CHECK(std::isfinite(opt_.label_smoothing) && opt_.label_smoothing >= 0 && opt_.label_smoothing < 1,
               ValueError, "classify: --label-smoothing must be in [0, 1), got ", opt_.label_smoothing);
  CORELM_CHECK(std::isfinite(opt_.dropout) && opt_.dropout >= 0 && opt_.dropout < 1, ValueError,
               "classify: --classifier-dropout must be in [0, 1), got ", opt_.dropout);
  CORELM_CHECK(std::isfinite(opt_.distill_weight) && opt_.distill_weight >= 0 && opt_.distill_weight <= 1, ValueError,
               "classify: --distill-weight must be in [0, 1], got ", opt_.distill_weight);
  CORELM_CHECK(opt_.eval_batch >= 1, ValueError, "classify: evaluation batch must be positive");
}

namespace {
// FNV-1a (corelm/hash.h) over the batch's ids and lengths, mixed with the seed: the dropout masks
// of a batch.
uint64_t batch_mask_seed(uint64_t seed, const Batch& batch) {
  uint64_t h = kFnv1aOffset ^ (seed * 0x9E3779B97F4A7C15ull);
  for (const Tensor* t : {&batch.ids, &batch.lengths}) {
    const std::vector<int64_t> v = t->to_int_vector();
    h = fnv1a_bytes(v.data(), v.size() * sizeof(int64_t), h);
  }
  return h;
}
}  // namespace

Tensor ClassifyObjective::loss(const model::Decoder& model, const Batch& batch) {
  Generator gen(opt_.dropout > 0 ? batch_mask_seed(opt_.seed, batch) : 0);
  const Tensor logits = classifier_logits(model, batch, opt_.train_body, static_cast<float>(opt_.dropout), &gen);
  const Tensor ce = ops::cross_entropy(logits, batch.targets);
  const double eps = opt_.label_smoothing;
  const double w = opt_.distill_weight;
  const bool distil = batch.soft_targets.defined() && w != 0;
  // log_softmax once, for the smoothing term and the teacher's term alike.
  const Tensor logp = (eps != 0 || distil) ? ops::log_softmax(logits, -1) : Tensor();
  Tensor hard = ce;
  // Smoothed target (1 - eps) * onehot + eps / L: the loss is (1 - eps) * CE + eps * mean over
  // classes of -log_softmax (as torch's label_smoothing).
  if (eps != 0) {
    const Tensor uniform = ops::neg(ops::mean(logp));
    hard = ops::add(ops::scale(ce, static_cast<float>(1 - eps)), ops::scale(uniform, static_cast<float>(eps)));
  }
  if (!distil) return hard;
  CORELM_CHECK(batch.soft_targets.shape() == logits.shape(), ValueError, "classify: the teacher's distributions ",
               shape_str(batch.soft_targets.shape()), " do not match the head's logits ", shape_str(logits.shape()));
  // Cross-entropy against the teacher: -sum_c q_c log p_c, averaged over the rows.
  const float rows = static_cast<float>(logits.shape()[0]);
  const Tensor soft = ops::scale(ops::sum(ops::mul(batch.soft_targets, logp)), -1.0f / rows);
  if (w == 1) return soft;
  return ops::add(ops::scale(hard, static_cast<float>(1 - w)), ops::scale(soft, static_cast<float>(w)));
}

double ClassifyObjective::evaluate(const model::Decoder& model, int64_t step,
                                   std::vector<std::pair<std::string, double>>& fields) {
  if (dev_.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto logits = classify_logits(model, dev_, opt_.pad_id, opt_.eval_batch);
  std::vector<int64_t> labels;
  for (const auto& r : dev_) labels.push_back(r.label);
  const CalibrationStats s = calibration_stats(logits, labels, 1.0);
  fields.emplace_back("dev_accuracy", s.accuracy);
  const bool scheduled = steps_ < 0 || step == steps_ || (eval_every_ > 0 && step % eval_every_ == 0);
  if (scheduled && (s.accuracy > best_acc_ || (s.accuracy == best_acc_ && s.nll < best_loss_))) {
    best_acc_ = s.accuracy;
    best_loss_ = s.nll;
    best_step_ = step;
    best_.clear();
    best_names_.clear();
    for (const auto& [name, t] : model.named_parameters()) {
      best_.push_back(t.detach().clone());
      best_names_.push_back(name);
    }
    persist_best();
  }
  return s.nll;
}

namespace {
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
}  // namespace

void ClassifyObjective::persist_best() const {
  if (best_path_.empty() || best_.empty()) return;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t i = 0; i < best_.size(); ++i) tensors.emplace_back(best_names_[i], best_[i]);
  io::save_safetensors(best_path_, tensors,
                       {{"step", std::to_string(best_step_)}, {"dev_accuracy", exact(best_acc_)}, {"dev_loss", exact(best_loss_)}});
}

void ClassifyObjective::on_start(const std::string& out_dir, int64_t resumed_step, int64_t eval_every, int64_t steps) {
  eval_every_ = eval_every;
  steps_ = steps;
  if (out_dir.empty()) return;
  best_path_ = (fs::path(out_dir) / "best_dev.safetensors").string();
  std::error_code ec;
  if (resumed_step < 0 || !fs::exists(best_path_, ec)) {
    fs::remove(best_path_, ec);  // a fresh run: an older run's best is not this one's
    return;
  }
  const io::SafetensorsFile f = io::SafetensorsFile::open(best_path_);
  const auto& md = f.metadata();
  auto field = [&](const char* k) -> const std::string& {
    auto it = md.find(k);
    CORELM_CHECK(it != md.end(), FormatError, best_path_, ": metadata '", k, "' is missing (not a best_dev file)");
    return it->second;
  };
  int64_t step = 0;
  double acc = 0, loss = 0;
  try {
    step = std::stoll(field("step"));
    acc = std::stod(field("dev_accuracy"));
    loss = std::stod(field("dev_loss"));
  } catch (const std::logic_error&) {  // stoll/stod: not a number
    throw FormatError(best_path_ + ": metadata step/dev_accuracy/dev_loss is not a number");
  }
  if (step > resumed_step) return;  // from after the checkpoint: the resumed run finds it again
  best_step_ = step;
  best_acc_ = acc;
  best_loss_ = loss;
  best_.clear();
  best_names_.clear();
  for (const std::string& name : f.names()) {
    best_.push_back(f.get(name).clone());
    best_names_.push_back(name);
  }
}

void ClassifyObjective::restore_best(model::Decoder& model) const {
  if (best_.empty()) return;
  const auto& named = model.named_parameters();
  CORELM_CHECK(named.size() == best_.size(), ValueError, "classify: the best parameters do not match the model");
  for (size_t i = 0; i < named.size(); ++i) {
    CORELM_CHECK(named[i].first == best_names_[i], ValueError, "classify: the best parameters name '", best_names_[i],
                 "' where the model has '", named[i].first, "'");
    model.load_parameter(named[i].first, best_[i]);
  }
}

ClassifyFinish finish_classifier(model::Decoder& model, const ClassifyObjective& objective,
                                 const std::vector<ClassifyRecord>& dev, const std::string& out_dir, TokenId pad_id) {
  ClassifyFinish f;
  objective.restore_best(model);
  f.best_step = objective.best_step();
  model::ModelConfig config = model.config();
  if (!dev.empty()) {
    const auto logits = classify_logits(model, dev, pad_id);
    std::vector<int64_t> labels;
    for (const auto& r : dev) labels.push_back(r.label);
    const CalibrationStats before = calibration_stats(logits, labels, 1.0);
    f.temperature = fit_temperature(logits, labels);
    const CalibrationStats after = calibration_stats(logits, labels, f.temperature);
    f.dev_accuracy = before.accuracy;
    f.dev_loss = before.nll;
    f.ece_before = before.ece;
    f.ece_after = after.ece;
  }
  config.classifier_temperature = f.temperature;
  // Weights first, then the config that names their temperature: each file is replaced whole
  // (temp + rename), and the checkpoints under out_dir/checkpoints are not touched.
  const fs::path out(out_dir);
  std::vector<std::pair<std::string, Tensor>> params;
  for (const auto& [name, t] : model.named_parameters()) params.emplace_back(name, t.detach().contiguous());
  io::save_safetensors((out / "model.safetensors").string(), params, {{"format", "pt"}});
  config.save((out / "config.json").string());
  return f;
}

}  // namespace corelm::train
