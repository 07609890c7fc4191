// corelm tokenizer train: learn a byte-level BPE from a corpus and write a HF tokenizer.json.
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "command_registry.h"
#include "corelm/tokenizer_train.h"

namespace corelm::cli {
namespace {

struct TrainArgs {
  BpeTrainOptions options;
  std::vector<std::string> inputs;
  std::string output = "tokenizer.json";
  bool no_progress = false;
};

RegisterCommand reg([](CLI::App& root) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App& group = subcommand_group(root, "tokenizer", "Tokenizer tools");
  CLI::App* c = group.add_subcommand("train", "Learn byte-level BPE merges from a corpus; writes a Hugging Face tokenizer.json");
  c->add_option("--vocab-size", args->options.vocab_size, "vocabulary size incl. 256 byte tokens and special tokens")
      ->required();
  c->add_option("--input", args->inputs, "corpus text files")->required();
  c->add_option("--output", args->output,
                "tokenizer.json to write (a file path; replaced whole, through a unique temp file beside it)")
      ->capture_default_str();
  c->add_option("--pattern", args->options.pattern, "pre-tokenizer: gpt2, llama3 or qwen2")->capture_default_str();
  c->add_option("--special", args->options.special_tokens, "special tokens (appended after the learned tokens)")
      ->capture_default_str();
  c->add_option("--min-frequency", args->options.min_frequency, "stop when the best pair occurs less often")
      ->capture_default_str();
  c->add_option("--max-words", args->options.max_distinct_words, "bound on distinct pre-tokens kept while counting")
      ->capture_default_str();
  c->add_flag("--no-progress", args->no_progress, "no progress line on stderr");
  c->callback([args] {
    args->options.progress = !args->no_progress;
    BpeTrainStats s = train_bpe(args->inputs, args->options, args->output);
    nlohmann::ordered_json summary{{"output", args->output},     {"vocab_size", s.vocab_size},
                                   {"merges", s.merges},         {"bytes", s.bytes},
                                   {"words", s.words},           {"distinct_words", s.distinct_words},
                                   {"count_seconds", s.count_seconds}, {"merge_seconds", s.merge_seconds}};
    std::cout << summary.dump() << "\n";
  });
});

}  // namespace
}  // namespace corelm::cli
