// Weight averaging ("model soups"): the element-wise mean of models fine-tuned from one
// initialisation, and the greedy soup that adds a model only when the dev accuracy does not fall.
// The dev scoring is the head's own (classify_logits, calibration_stats, fit_temperature).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/model_dir.h"
#include "corelm/safetensors.h"
#include "corelm/train.h"

#include "train/checkpoint_internal.h"

namespace corelm::train {
namespace {

// The config with the one field averaging may change set aside, for comparing two models.
nlohmann::json comparable(const model::ModelConfig& c) {
  model::ModelConfig k = c;
  k.classifier_temperature = 1.0;
  return k.to_json();
}

// The first differing top-level field of two configs, for the error.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto& [key, value] : a.items())
    if (!b.contains(key) || b.at(key) != value) return key;
  for (const auto& [key, value] : b.items())
    if (!a.contains(key)) return key;
  return "(none)";
}

void check_same(const std::vector<const model::Decoder*>& models, const std::vector<std::string>& names) {
  CORELM_CHECK(models.size() == names.size(), ValueError, "merge: ", models.size(), " models but ", names.size(),
               " names");
  CORELM_CHECK(!models.empty(), ValueError, "merge: no models");
  const nlohmann::json first = comparable(models[0]->config());
  for (size_t i = 1; i < models.size(); ++i) {
    const nlohmann::json other = comparable(models[i]->config());
    CORELM_CHECK(other == first, ValueError, "merge: ", names[i], " has another config than ", names[0], " (field '",
                 first_difference(first, other), "'); only models of one architecture, vocabulary and head average");
  }
}

// Mean of the models at `members` (one or more), as a decoder of `config`.
model::Decoder mean_of(const std::vector<const model::Decoder*>& models, const std::vector<size_t>& members,
                       const model::ModelConfig& config) {
  autograd::NoGradGuard no_grad;
  model::Decoder out(config);
  const auto& ref = models[members[0]]->named_parameters();
  const double n = static_cast<double>(members.size());
  for (size_t p = 0; p < ref.size(); ++p) {
    const int64_t count = ref[p].second.numel();
    std::vector<double> sum(static_cast<size_t>(count), 0.0);
    for (size_t m : members) {
      const auto& named = models[m]->named_parameters()[p];
      CORELM_CHECK(named.first == ref[p].first && named.second.shape() == ref[p].second.shape(), ValueError,
                   "merge: parameter ", p, " is '", named.first, "' in one model and '", ref[p].first, "' in another");
      const Tensor c = named.second.contiguous();
      const float* x = c.data<float>();
      for (int64_t k = 0; k < count; ++k) sum[static_cast<size_t>(k)] += x[k];
    }
    std::vector<float> mean(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) mean[static_cast<size_t>(k)] = static_cast<float>(sum[static_cast<size_t>(k)] / n);
    out.load_parameter(ref[p].first, Tensor::from_vector(mean, ref[p].second.shape()));
  }
  return out;
}

// Every parameter bit-identical (names and shapes too). memcmp stops at the first differing
// byte, so distinct fine-tunes cost next to nothing and only a true copy is read in full.
bool same_weights(const model::Decoder& a, const model::Decoder& b) {
  const auto& x = a.named_parameters();
  const auto& y = b.named_parameters();
  if (x.size() != y.size()) return false;
  for (size_t p = 0; p < x.size(); ++p) {
    if (x[p].first != y[p].first || x[p].second.shape() != y[p].second.shape()) return false;
    const Tensor cx = x[p].second.contiguous(), cy = y[p].second.contiguous();
    if (std::memcmp(cx.data<float>(), cy.data<float>(), static_cast<size_t>(cx.numel()) * sizeof(float)) != 0)
      return false;
  }
  return true;
}

}  // namespace

// Indexed by SoupMethod: the one place the spellings live.
const std::vector<std::string>& soup_method_names() {
  static const std::vector<std::string> names{"uniform", "greedy"};
  return names;
}

SoupMethod parse_soup_method(const std::string& name) {
  const std::vector<std::string>& names = soup_method_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<SoupMethod>(i);
  throw ValueError("--method must be uniform or greedy, got '" + name + "'");
}

std::string soup_method_name(SoupMethod method) { return soup_method_names().at(static_cast<size_t>(method)); }

model::Decoder average_decoders(const std::vector<const model::Decoder*>& models,
                                const std::vector<std::string>& names) {
  CORELM_CHECK(models.size() >= 2, ValueError, "merge: give at least two models to average, got ", models.size());
  check_same(models, names);
  model::ModelConfig config = models[0]->config();
  config.classifier_temperature = 1.0;
  std::vector<size_t> all(models.size());
  std::iota(all.begin(), all.end(), size_t{0});
  return mean_of(models, all, config);
}

Soup classifier_soup(const std::vector<const model::Decoder*>& models, const std::vector<std::string>& names,
                     const std::vector<ClassifyRecord>& dev, TokenId pad_id, SoupMethod method) {
  CORELM_CHECK(models.size() >= 2, ValueError, "merge: give at least two models to average, got ", models.size());
  for (size_t i = 0; i < models.size(); ++i)
    CORELM_CHECK(models[i]->config().has_classifier(), ValueError, "merge --dev: ", names[i],
                 " has no classification head (score.weight); --dev scores heads only");
  check_same(models, names);
  CORELM_CHECK(!dev.empty(), ValueError, "merge: the dev records are empty");
  std::vector<int64_t> labels;
  for (const auto& r : dev) labels.push_back(r.label);

  SoupResult res;
  // Logits do not depend on the temperature (it divides them only when they are turned into
  // probabilities), so the soup's dev logits, kept from its scoring, also fit its temperature.
  std::vector<std::vector<std::vector<float>>> alone_logits;
  std::vector<CalibrationStats> alone;
  for (const model::Decoder* m : models) {
    alone_logits.push_back(classify_logits(*m, dev, pad_id));
    alone.push_back(calibration_stats(alone_logits.back(), labels, 1.0));
  }
  std::vector<size_t> order(models.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (alone[a].accuracy != alone[b].accuracy) return alone[a].accuracy > alone[b].accuracy;
    return alone[a].nll < alone[b].nll;
  });

  model::ModelConfig config = models[0]->config();
  config.classifier_temperature = 1.0;
  std::vector<size_t> members;
  std::vector<std::vector<float>> logits;  // the soup's dev logits
  CalibrationStats current;
  if (method == SoupMethod::kUniform) {
    members = order;
    logits = classify_logits(mean_of(models, members, config), dev, pad_id);
    current = calibration_stats(logits, labels, 1.0);
  } else {
    members = {order[0]};
    logits = alone_logits[order[0]];
    current = alone[order[0]];
    for (size_t k = 1; k < order.size(); ++k) {
      std::vector<size_t> candidate = members;
      candidate.push_back(order[k]);
      std::vector<std::vector<float>> z = classify_logits(mean_of(models, candidate, config), dev, pad_id);
      const CalibrationStats s = calibration_stats(z, labels, 1.0);
      if (s.accuracy >= current.accuracy) {
        members = std::move(candidate);
        logits = std::move(z);
        current = s;
      }
    }
  }
  for (size_t i : order) {
    SoupIngredient g;
    g.name = names[i];
    g.dev_accuracy = alone[i].accuracy;
    g.dev_loss = alone[i].nll;
    g.kept = std::find(members.begin(), members.end(), i) != members.end();
    res.ingredients.push_back(g);
  }
  // The temperature from the soup's dev logits; the one decoder built for it carries it.
  res.dev_accuracy = current.accuracy;
  res.dev_loss = current.nll;
  res.temperature = fit_temperature(logits, labels);
  res.ece_before = calibration_stats(logits, labels, 1.0).ece;
  res.ece_after = calibration_stats(logits, labels, res.temperature).ece;
  config.classifier_temperature = res.temperature;
  return Soup{mean_of(models, members, config), std::move(res)};
}

MergeReport merge_model_dirs(const MergeOptions& o) {
  namespace fs = std::filesystem;
  CORELM_CHECK(o.models.size() >= 2, ValueError, "merge: give at least two model directories, got ", o.models.size());
  CORELM_CHECK(!o.out.empty(), ValueError, "merge: --out is required");
  MergeReport report;
  report.scored = !o.dev.empty();
  report.method = o.method.value_or(report.scored ? SoupMethod::kGreedy : SoupMethod::kUniform);
  CORELM_CHECK(report.scored || report.method == SoupMethod::kUniform, ValueError,
               "merge: --method greedy chooses the models on a dev set; give --dev DEV.jsonl (or --method uniform)");
  // The vocabulary must be one: averaged embeddings of two tokenizers would be noise.
  auto tokenizer_of = [](const std::string& dir) { return detail::read_file((fs::path(dir) / "tokenizer.json").string()); };
  const std::string tokenizer_json = tokenizer_of(o.models[0]);
  for (size_t i = 1; i < o.models.size(); ++i)
    CORELM_CHECK(tokenizer_of(o.models[i]) == tokenizer_json, ValueError, "merge: ",
                 o.models[i], "/tokenizer.json differs from ", o.models[0],
                 "/tokenizer.json; only models of one tokenizer average");

  std::vector<model::LoadedModel> loaded;
  loaded.reserve(o.models.size());
  for (const auto& dir : o.models) loaded.push_back(model::load_model_dir(dir));
  // Each model bit-identical to an earlier one is set aside (it would weigh twice in the mean).
  std::vector<const model::Decoder*> models;
  std::vector<std::string> names;
  std::vector<std::pair<size_t, size_t>> duplicates;  // (model, the earlier distinct model it equals)
  std::vector<size_t> distinct;                        // indices into o.models
  for (size_t i = 0; i < loaded.size(); ++i) {
    auto twin = std::find_if(distinct.begin(), distinct.end(),
                             [&](size_t j) { return same_weights(loaded[j].decoder, loaded[i].decoder); });
    if (twin != distinct.end()) {
      duplicates.emplace_back(i, *twin);
    } else {
      distinct.push_back(i);
      models.push_back(&loaded[i].decoder);
      names.push_back(o.models[i]);
    }
  }
  // Two or more given (checked above) and fewer than two distinct: there is a duplicate to name.
  CORELM_CHECK(models.size() >= 2, ValueError, "merge: ", o.models[duplicates[0].first], " has the same weights as ",
               o.models[duplicates[0].second], " (every tensor bit-identical): fewer than two distinct models to average");

  std::optional<model::Decoder> merged;
  if (report.scored) {
    const model::ModelConfig& c = models[0]->config();
    CORELM_CHECK(c.has_classifier(), ValueError, "merge --dev: ", o.models[0],
                 " has no classification head (score.weight); --dev scores heads only");
    ClassifyDataOptions d;
    d.labels = c.labels;
    d.text_field = o.text_field;
    d.label_field = o.label_field;
    d.template_text = c.classifier_template.empty() ? "{text}" : c.classifier_template;
    CORELM_CHECK(o.max_tokens >= 1, ValueError, "merge: --max-tokens must be positive, got ", o.max_tokens);
    d.max_tokens = std::min<int64_t>(o.max_tokens, c.max_position_embeddings);
    const Tokenizer& tok = *loaded[0].tokenizer;
    const std::vector<ClassifyRecord> dev = load_classify_records(o.dev, tok, d);
    const TokenId pad = c.pad_token_id >= 0 ? static_cast<TokenId>(c.pad_token_id)
                                            : tok.pad_id().value_or(tok.eos_id().value_or(0));
    Soup soup = classifier_soup(models, names, dev, pad, report.method);
    report.soup = std::move(soup.result);
    merged.emplace(std::move(soup.decoder));
  } else {
    merged.emplace(average_decoders(models, names));
    for (const auto& dir : names) report.soup.ingredients.push_back({dir, 0, 0, true, ""});
  }
  for (const auto& [i, j] : duplicates) {
    SoupIngredient g{o.models[i], 0, 0, false, o.models[j]};
    for (const auto& k : report.soup.ingredients)
      if (k.name == o.models[j]) g.dev_accuracy = k.dev_accuracy, g.dev_loss = k.dev_loss;
    report.soup.ingredients.push_back(g);
  }
  report.parameters = merged->config().num_parameters(true);
  loaded.clear();
  model::save_model_dir(o.out, *merged);
  io::write_file_atomic((fs::path(o.out) / "tokenizer.json").string(), tokenizer_json);
  return report;
}

}  // namespace corelm::train
