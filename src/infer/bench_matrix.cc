// The llama-bench-style matrix of `corelm bench model --pp/--tg/--depth/--repetitions`.
#include "corelm/bench_matrix.h"

#include <chrono>
#include <cmath>

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

// One warm-up and `reps` timed runs of `fn` (which returns the tokens it processed).
template <typename Fn>
void measure(BenchTest& t, int reps, Fn fn) {
  fn();
  for (int r = 0; r < reps; ++r) {
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

namespace {
// Bytes of a one-row cache of kProbe positions (a multiple of every block size), from make_cache.
constexpr int64_t kProbe = 256;
double probe_bytes(const model::Decoder& decoder) {
  model::KVCache probe = decoder.make_cache(1, kProbe);
  double bytes = 0;
  for (int64_t l = 0; l < decoder.config().num_hidden_layers; ++l)
    bytes += static_cast<double>(probe.k_bytes(l).nbytes() + probe.v_bytes(l).nbytes());  // any type
  return bytes;
}
}  // namespace

int64_t kv_cache_bytes(const model::Decoder& decoder, int64_t positions) {
  return static_cast<int64_t>(std::ceil(probe_bytes(decoder) * static_cast<double>(positions) / kProbe));
}

int64_t max_context_for_kv_budget(const model::Decoder& decoder, int64_t budget) {
  CORELM_CHECK(budget >= 0, ValueError, "kv budget must be >= 0 bytes, got ", budget);
  const double per_position = probe_bytes(decoder) / kProbe;
  return static_cast<int64_t>(std::floor(static_cast<double>(budget) / per_position));
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
        // The depth is context, filled once and untimed; each run restarts from it.
        if (depth > 0) d.forward_cached(random_ids(depth, V, gen), cache, row, model::Logits::None);
        const Tensor prompt = random_ids(kind == 0 ? n : 1, V, gen);
        if (kind == 0)
          measure(t, o.repetitions, [&] {
            cache.set_length(0, depth);
            d.forward_cached(prompt, cache, row, model::Logits::Last);
            return n;
          });
        else
          measure(t, o.repetitions, [&] {
            cache.set_length(0, depth);
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
