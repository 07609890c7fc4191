// The learning check (slow): a tiny-shaped model trained on one core on the King James Bible
// (Debian's bible-kjv-text) must reach a validation loss clearly below the unigram entropy of
// the corpus, i.e. it must have learned more than token frequencies. The curve is printed for
// docs/TRAINING.md.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unordered_map>

#include "corelm/model.h"
#include "corelm/thread_pool.h"
#include "corelm/tokenizer.h"
#include "corelm/tokenizer_train.h"
#include "corelm/train.h"

namespace corelm::train {
namespace {
namespace fs = std::filesystem;

// The text of bible-kjv-text is stored compressed for the `bible` program (package bible-kjv);
// `bible -f gen1:1-rev22:21` prints all 31102 verses, one per line.
bool extract_kjv(const fs::path& out) {
  if (!fs::exists("/usr/lib/bible.data") || !fs::exists("/usr/bin/bible")) return false;
  const std::string cmd = "/usr/bin/bible -f gen1:1-rev22:21 > '" + out.string() + "' 2>/dev/null";
  return std::system(cmd.c_str()) == 0 && fs::file_size(out) > 4'000'000;
}

double unigram_entropy(const TokenDataset& d) {
  std::unordered_map<TokenId, int64_t> counts;
  for (int64_t i = 0; i < d.size(); ++i) counts[d[i]]++;
  double h = 0;
  for (const auto& [id, c] : counts) {
    const double p = static_cast<double>(c) / static_cast<double>(d.size());
    h -= p * std::log(p);
  }
  return h;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(SlowLearning, TinyShapeOnKjvBeatsUnigramEntropy) {
  // ~150 s of one core normally; several times that under AddressSanitizer, where the fast
  // Trainer.* tests already cover the same code paths.
  if (kSanitized) GTEST_SKIP() << "too slow under sanitizers";
  const fs::path dir = fs::temp_directory_path() / ("corelm_learning_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path text = dir / "kjv.txt";
  if (!extract_kjv(text)) GTEST_SKIP() << "bible-kjv-text / bible-kjv not installed (scripts/setup installs them)";
  set_num_threads(1);

  // The tiny preset's depth and head size at half width with a 4096-token BPE: the reference
  // (scalar) kernels train the full tiny shape at ~200 tokens/s, too slow for a 3-minute test.
  model::ModelConfig config = model::ModelConfig::preset("tiny");
  config.hidden_size = 128;
  config.intermediate_size = 320;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.head_dim = 64;
  config.vocab_size = 4096;
  BpeTrainOptions bpe;
  bpe.vocab_size = static_cast<size_t>(config.vocab_size);
  const std::string tok_path = (dir / "tokenizer.json").string();
  train_bpe({text.string()}, bpe, tok_path);
  auto tok = Tokenizer::load(tok_path);
  TokenDataset data = TokenDataset::from_text_files(*tok, {text.string()}, 1);
  const double entropy = unigram_entropy(data);

  TrainOptions o;
  o.out_dir = (dir / "run").string();
  o.steps = 240;
  o.batch = 8;
  o.seq = 64;
  o.schedule.kind = ScheduleKind::kCosine;
  o.schedule.lr = 3e-3;
  o.schedule.warmup = 20;
  o.eval_every = 50;
  o.eval_batches = 8;
  o.sample_tokens = 16;
  o.log_every = 25;
  o.seed = 1;
  const Split split = split_tokens(data.size(), 0.05, o.seq);
  const auto val = sequential_batches(data, split.train_end, data.size(), o.batch, o.seq, o.eval_batches);
  model::Decoder m(config);
  m.init_weights(o.seed);
  WindowSampler sampler(data, 0, split.train_end, o.seed);
  const auto t0 = std::chrono::steady_clock::now();
  const TrainResult r = train(m, sampler, &val, tok.get(), tok_path, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("unigram entropy of the corpus: %.4f nats/token (%lld tokens, vocab %lld)\n", entropy,
              static_cast<long long>(data.size()), static_cast<long long>(config.vocab_size));
  std::printf("step  train_loss  val_loss\n");
  for (const CurvePoint& p : r.curve)
    std::printf("%4lld  %10.4f  %8.4f\n", static_cast<long long>(p.step), p.train_loss, p.val_loss);
  std::printf("%.1f s, %.0f tokens/s\n", seconds, r.tokens_per_s);
  ASSERT_TRUE(r.last_val_loss.has_value());
  EXPECT_LT(*r.last_val_loss, entropy - 0.5) << "validation loss did not get clearly below the unigram entropy";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace corelm::train
