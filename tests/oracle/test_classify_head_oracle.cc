// corelm's classification head against Hugging Face's LlamaForSequenceClassification:
// tests/oracle/hf_classify_head.py saves a seeded model (config.json with id2label / label2id /
// pad_token_id, score.weight) and HF's logits on a padded batch. Here the folder is loaded with
// model::load_model (as `corelm run` does) and the head logits are computed two ways: the training
// op path (train::classifier_logits) and the inference path the runner uses (forward_cached with
// Logits::None, last real token, score.weight), in f32 and on the bf16 fast path.
// Errors (max_abs, max_rel = max_abs / max|reference|) are printed as `ORACLE classify_head=...`.
#include <gtest/gtest.h>

#include <cstdio>

#include "corelm/autograd.h"
#include "corelm/model_loader.h"
#include "corelm/safetensors.h"
#include "corelm/train.h"
#include "oracle/oracle_support.h"

namespace corelm::oracle {
namespace {

constexpr double kF32Tol = 3e-5;   // max_rel (measured ~1e-6)
constexpr double kBf16Tol = 3e-2;  // max_rel: bf16 weights and activations in the matmuls

const Fixture& fixture() { return load_fixture("hf_classify_head.py", "classify_head_oracle.json"); }

// Head logits [B, L] as the runner computes them: hidden states of each row's real tokens
// (padding is never fed), the last one through score.weight.
std::vector<float> inference_logits(const model::Decoder& d, const Tensor& ids, const std::vector<int64_t>& lengths) {
  autograd::NoGradGuard no_grad;
  const Tensor w = d.classifier_weight().contiguous();
  const int64_t H = d.config().hidden_size, L = w.size(0);
  std::vector<float> out;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const Tensor row = ids.slice(0, static_cast<int64_t>(b), static_cast<int64_t>(b) + 1).slice(1, 0, lengths[b]).contiguous();
    model::KVCache cache(d.config(), 1, lengths[b]);
    const Tensor h = d.forward_cached(row, cache, {0}, model::Logits::None).contiguous();
    const float* last = h.data<float>() + (lengths[b] - 1) * H;
    for (int64_t j = 0; j < L; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < H; ++k) acc += double(last[k]) * w.data<float>()[j * H + k];
      out.push_back(static_cast<float>(acc));
    }
  }
  return out;
}

TEST(ClassifyHeadOracle, LogitsMatchLlamaForSequenceClassification) {
  const Fixture& fx = fixture();
  CORELM_REQUIRE_FIXTURE(fx);
  const std::string folder = fx.data->at("folder").get<std::string>();
  model::LoadOptions lo;
  lo.require_tokenizer = false;  // HF's folder holds weights and config only
  model::Checkpoint ck = model::load_model(folder, lo);
  model::Decoder& d = ck.model.decoder;
  ASSERT_TRUE(d.config().has_classifier());
  EXPECT_EQ(d.config().labels, fx.data->at("labels").get<std::vector<std::string>>());
  EXPECT_EQ(d.config().pad_token_id, 0);
  auto results = io::SafetensorsFile::open(folder + "/results.safetensors");
  const Tensor ids = results.get("ids");
  const std::vector<int64_t> lengths = results.get("lengths").to_int_vector();
  const Tensor ref_t = results.get("logits").contiguous();
  const std::vector<float> ref(ref_t.data<float>(), ref_t.data<float>() + ref_t.numel());

  train::Batch batch{ids, Tensor::from_vector(std::vector<int64_t>(lengths.size(), 0), {static_cast<int64_t>(lengths.size())})};
  batch.lengths = Tensor::from_vector(lengths, {static_cast<int64_t>(lengths.size())});
  Tensor ours_t;
  {
    autograd::NoGradGuard no_grad;
    ours_t = train::classifier_logits(d, batch).contiguous();
  }
  const ErrorStats train_path =
      ErrorStats::between(std::vector<float>(ours_t.data<float>(), ours_t.data<float>() + ours_t.numel()), ref);
  const ErrorStats f32 = ErrorStats::between(inference_logits(d, ids, lengths), ref);
  d.prepare_inference(model::Precision::BF16);
  const ErrorStats bf16 = ErrorStats::between(inference_logits(d, ids, lengths), ref);
  std::printf("ORACLE classify_head=train_path max_abs=%s max_rel=%s\n", format_error(train_path.max_abs).c_str(),
              format_error(train_path.max_rel).c_str());
  std::printf("ORACLE classify_head=inference_f32 max_abs=%s max_rel=%s\n", format_error(f32.max_abs).c_str(),
              format_error(f32.max_rel).c_str());
  std::printf("ORACLE classify_head=inference_bf16 max_abs=%s max_rel=%s\n", format_error(bf16.max_abs).c_str(),
              format_error(bf16.max_rel).c_str());
  EXPECT_LE(train_path.max_rel, kF32Tol);
  EXPECT_LE(f32.max_rel, kF32Tol);
  EXPECT_LE(bf16.max_rel, kBf16Tol);
}

}  // namespace
}  // namespace corelm::oracle
