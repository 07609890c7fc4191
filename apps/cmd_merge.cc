// corelm merge: average the weights of models fine-tuned from one start ("model soup"), optionally
// choosing and calibrating them on a labelled dev set. Parsing and printing only; the work is
// train::merge_model_dirs (src/train/soup.cc).
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/train.h"

namespace corelm::cli {
namespace {

struct MergeArgs {
  train::MergeOptions opt;
  std::string method;  // "" : the library's default for the dev/no-dev case
  bool json = false;
};

void run(MergeArgs& a) {
  if (!a.method.empty()) a.opt.method = train::parse_soup_method(a.method);
  const train::MergeReport r = train::merge_model_dirs(a.opt);
  const std::string method = train::soup_method_name(r.method);
  int kept = 0;
  for (const auto& g : r.soup.ingredients) {
    kept += g.kept;
    if (!g.duplicate_of.empty())
      std::fprintf(stderr, "merge: warning: %s has the same weights as %s; it is counted once\n", g.name.c_str(),
                   g.duplicate_of.c_str());
  }
  if (a.json) {
    nlohmann::ordered_json models = nlohmann::ordered_json::array();
    for (const auto& g : r.soup.ingredients) {
      nlohmann::ordered_json m{{"model", g.name}, {"kept", g.kept}};
      if (!g.duplicate_of.empty()) m["duplicate_of"] = g.duplicate_of;
      if (r.scored) {
        m["dev_accuracy"] = g.dev_accuracy;
        m["dev_loss"] = g.dev_loss;
      }
      models.push_back(m);
    }
    nlohmann::ordered_json j{{"out", a.opt.out}, {"method", method}, {"kept", kept}, {"parameters", r.parameters},
                             {"models", models}};
    if (r.scored) {
      j["dev_accuracy"] = r.soup.dev_accuracy;
      j["dev_loss"] = r.soup.dev_loss;
      j["temperature"] = r.soup.temperature;
      j["ece_before"] = r.soup.ece_before;
      j["ece_after"] = r.soup.ece_after;
    }
    std::cout << j.dump() << "\n";
    return;
  }
  for (const auto& g : r.soup.ingredients) {
    if (!g.duplicate_of.empty())
      std::printf("same   as %s  %s\n", g.duplicate_of.c_str(), g.name.c_str());
    else if (r.scored)
      std::printf("%-6s dev accuracy %.4f  loss %.4f  %s\n", g.kept ? "kept" : "left", g.dev_accuracy, g.dev_loss,
                  g.name.c_str());
    else
      std::printf("kept   %s\n", g.name.c_str());
  }
  if (r.scored)
    std::printf("%s soup of %d: dev accuracy %.4f  loss %.4f  temperature %.3f (ECE %.4f -> %.4f) -> %s\n",
                method.c_str(), kept, r.soup.dev_accuracy, r.soup.dev_loss, r.soup.temperature, r.soup.ece_before,
                r.soup.ece_after, a.opt.out.c_str());
  else
    std::printf("uniform average of %d models -> %s\n", kept, a.opt.out.c_str());
}

RegisterCommand reg([](CLI::App& root) {
  auto a = std::make_shared<MergeArgs>();
  CLI::App* c = root.add_subcommand(
      "merge", "Average the weights of models fine-tuned from one start (a model soup); with --dev, greedy choice and calibration on a labelled dev set");
  c->add_option("models", a->opt.models, "model directories (corelm train outputs of one architecture and tokenizer)")
      ->required()
      ->expected(2, -1);
  c->add_option("--out", a->opt.out, "output model directory")->required();
  c->add_option("--dev", a->opt.dev,
                "labelled JSONL for heads: score each model and the soup there, fit the soup's temperature");
  c->add_option("--method", a->method,
                "greedy (default with --dev: add models best-first while the dev accuracy does not fall) or uniform "
                "(default without --dev: average them all)")
      ->check(CLI::IsMember(train::soup_method_names()));
  c->add_option("--text-field", a->opt.text_field, "dev: field holding the text")->capture_default_str();
  c->add_option("--label-field", a->opt.label_field, "dev: field holding the label")->capture_default_str();
  c->add_option("--max-tokens", a->opt.max_tokens, "dev: prompt tokens per record (as train --seq)")
      ->capture_default_str();
  c->add_flag("--json", a->json, "one JSON object on stdout");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace corelm::cli
