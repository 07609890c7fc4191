// The llama-bench-style matrix of `corelm bench model --pp/--tg/--depth/--repetitions`.
#include "corelm/bench_matrix.h"

#include <chrono>
#include <cmath>
#include <optional>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/random.h"

namespace corelm::infer {
namespace {

using Clock = std::chrono::steady_clock;

Tensor random_ids(int64_t T, int64_t vocab, Generator& gen) {
  std::vector<int64_t> ids(static_cast<size_t>(T));
  for (auto& id : ids) id = static_cast<int64_t>(gen.below(static_cast<uint64_t>(vocab)));
  return Tensor::from_vector(ids, {1, T});
}

// One warm-up and `reps` timed runs of `fn` (which returns the tokens it processed), each after an
// untimed `reset` (which puts the cache back at the test's depth).
template <typename Reset, typename Fn>
void measure(BenchTest& t, int reps, Reset reset, Fn fn) {
  reset();
  fn();
  for (int r = 0; r < reps; ++r) {
    reset();
    const auto t0 = Clock::now();
    const double tokens = static_cast<double>(fn());
    t.samples_ts.push_back(tokens / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  double sum = 0;
  for (double v : t.samples_ts) sum += v;
  t.avg_ts = sum / static_cast<double>(t.samples_ts.size());
  double ss = 0;
  for (double v : t.samples_ts) ss += (v - t.avg_ts) * (v - t.avg_ts);
  // Sample standard deviation, as llama-bench reports (0 for a single repetition).
  t.stddev_ts = t.samples_ts.size() > 1 ? std::sqrt(ss / static_cast<double>(t.samples_ts.size() - 1)) : 0.0;
}

std::string test_name(const char* kind, int64_t n, int64_t depth) {
  std::string s = kind + std::to_string(n);
  if (depth > 0) s += " @ d" + std::to_string(depth);
  return s;
}

}  // namespace

int64_t kv_cache_bytes(const model::Decoder& decoder, int64_t positions) {
  // Full layers grow with the context (bytes_per_token counts block scales); sliding rings and
  // linear-attention states are a fixed size per sequence, whatever its length.
  const model::KVCache probe = decoder.make_cache(1, 1);
  return probe.fixed_bytes_per_row() + probe.bytes_per_token() * positions;
}

int64_t max_context_for_kv_budget(const model::Decoder& decoder, int64_t budget) {
  CORELM_CHECK(budget >= 0, ValueError, "kv budget must be >= 0 bytes, got ", budget);
  const model::KVCache probe = decoder.make_cache(1, 1);
  const int64_t fixed = probe.fixed_bytes_per_row(), per_token = probe.bytes_per_token();
  if (fixed > budget) return 0;
  if (per_token == 0) return -1;  // no full-attention layer: the cache does not grow with the context
  return (budget - fixed) / per_token;
}

std::vector<BenchTest> run_bench_matrix(const model::Decoder& d, const BenchMatrixOptions& o) {
  CORELM_CHECK(o.repetitions >= 1, ValueError, "bench: --repetitions must be >= 1, got ", o.repetitions);
  const int64_t ctx = d.config().max_position_embeddings, V = d.config().vocab_size;
  for (int64_t depth : o.depth)
    for (const auto* list : {&o.pp, &o.tg})
      for (int64_t n : *list) {
        CORELM_CHECK(depth >= 0 && n >= 0, ValueError, "bench: --pp, --tg and --depth must be >= 0");
        CORELM_CHECK(depth + n <= ctx, ValueError, "bench: depth ", depth, " + ", n, " tokens exceeds the model context (",
                     ctx, ")");
      }
  autograd::NoGradGuard no_grad;
  Generator gen(o.seed);
  std::vector<BenchTest> out;
  const std::vector<int64_t> row{0};
  for (int64_t depth : o.depth) {
    for (int kind = 0; kind < 2; ++kind)
      for (int64_t n : kind == 0 ? o.pp : o.tg) {
        if (n == 0) continue;
        BenchTest t;
        t.name = test_name(kind == 0 ? "pp" : "tg", n, depth);
        t.n_depth = depth;
        (kind == 0 ? t.n_prompt : t.n_gen) = n;
        model::KVCache cache = d.make_cache(1, depth + n);
        // The depth is context, filled once and untimed; each run restarts from it. A full-attention
        // cache rewinds by its length; rings and recurrent states cannot be rewound to a depth > 0,
        // so a hybrid's cache is restored from a copy taken after the fill.
        if (depth > 0) d.forward_cached(random_ids(depth, V, gen), cache, row, model::Logits::None);
        std::optional<model::KVCache> filled;
        if (depth > 0 && !cache.supports_prefix_blocks()) {
          filled.emplace(d.make_cache(1, depth + n));
          filled->copy_from(cache, 0, 0, depth);
        }
        const auto reset = [&] {
          if (filled) {
            cache.set_length(0, 0);  // a row with rings and states only rewinds to empty ...
            cache.copy_from(*filled, 0, 0, depth);  // ... and then takes the filled copy whole
          } else {
            cache.set_length(0, depth);
          }
        };
        const Tensor prompt = random_ids(kind == 0 ? n : 1, V, gen);
        if (kind == 0)
          measure(t, o.repetitions, reset, [&] {
            d.forward_cached(prompt, cache, row, model::Logits::Last);
            return n;
          });
        else
          measure(t, o.repetitions, reset, [&] {
            for (int64_t s = 0; s < n; ++s) d.forward_cached(prompt, cache, row, model::Logits::All);
            return n;
          });
        t.kv_bytes = kv_cache_bytes(d, depth + n);
        out.push_back(std::move(t));
      }
  }
  return out;
}

}  // namespace corelm::infer
