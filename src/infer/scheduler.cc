// Scheduler: continuous batching over one KVCache of `slots` rows (see docs/SCHEDULER.md).
// The loop thread owns every piece of decoding state; submit/cancel/stats/slots only touch the
// queue and the snapshots under `mu`. Each step: handle cancellations, admit queued requests into
// free slots (reusing prefix-cache blocks), run one batched decode forward over every decoding
// row, then prefill chunks within the token budget (equal-length chunks share a forward), and
// sample. Observer callbacks run on the loop thread without the lock held.
#include "corelm/scheduler.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "corelm/autograd.h"
#include "corelm/thread_pool.h"
#include "infer/sequence_text.h"

namespace corelm::infer {

void SchedulerOptions::validate() const {
  CORELM_CHECK(slots >= 1 && slots <= 4096, ValueError, "scheduler option slots must be in [1, 4096] (got ", slots, ")");
  CORELM_CHECK(context >= 0, ValueError, "scheduler option context must be >= 0 (got ", context,
               "; 0 uses the model's max_position_embeddings, at most 4096)");
  CORELM_CHECK(max_queue >= 0, ValueError, "scheduler option max_queue must be >= 0 (got ", max_queue, ")");
  CORELM_CHECK(prefill_chunk >= 1, ValueError, "scheduler option prefill_chunk must be >= 1 (got ", prefill_chunk, ")");
  CORELM_CHECK(step_token_budget >= prefill_chunk, ValueError, "scheduler option step_token_budget (", step_token_budget,
               ") must be >= prefill_chunk (", prefill_chunk, "): a step must fit one whole chunk");
  CORELM_CHECK(prefix_cache_blocks >= 0, ValueError, "scheduler option prefix_cache_blocks must be >= 0 (got ",
               prefix_cache_blocks, ")");
}

namespace {

using Clock = std::chrono::steady_clock;

// 64-bit FNV-1a over token ids, continued block by block: the key of a block is the hash of every
// token up to its end, so equal keys mean (barring collisions, checked on hit) equal prefixes.
constexpr uint64_t kHashStart = 1469598103934665603ull;
uint64_t hash_tokens(uint64_t h, const TokenId* t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x = static_cast<uint32_t>(t[i]);
    for (int b = 0; b < 4; ++b, x >>= 8) h = (h ^ (x & 0xff)) * 1099511628211ull;
  }
  return h;
}

struct Request;

struct Seq {
  Request* owner = nullptr;
  int index = 0;
  int64_t slot = -1;
  Sampler sampler;
  std::vector<TokenId> context;  // prompt + generated
  SequenceText text;
  std::optional<TokenConstraint> constraint;
  std::vector<std::pair<TokenId, int>> counts;  // generated token -> count (presence/frequency penalties)
  int64_t generated = 0;
  bool done = false;
  Seq(int i, const SamplingOptions& s, uint64_t seed, const std::vector<TokenId>& prompt, const Tokenizer& tok,
      const std::vector<std::string>& stop, int64_t allowed)
      : index(i), sampler(s, seed), context(prompt), text(tok, stop, prompt, allowed) {}
};

struct Request {
  RequestId id = 0;
  SequenceRequest req;
  std::shared_ptr<RequestObserver> obs;
  std::vector<TokenId> eos;
  std::vector<std::unique_ptr<Seq>> seqs;  // made at admission
  int64_t prompt_len = 0;
  int64_t pos = 0;      // prompt positions in the first slot's KV
  int64_t cached = 0;   // of which came from the prefix cache
  uint64_t hash = kHashStart;  // hash of prompt[0, hashed)
  int64_t hashed = 0;
  std::vector<uint64_t> block_keys;  // the prompt's blocks in the prefix cache, from position 0
  bool prefilling = true;
  bool plain = false;   // every pick is the plain argmax: the fused LM-head argmax may decode it
  bool gone = false;    // finished, cancelled or failed: leaves the active list at the step's end
};

struct Queued {
  RequestId id;
  SequenceRequest req;
  std::shared_ptr<RequestObserver> obs;
};

// One row's sampling outcome (filled in parallel, consumed in row order).
struct Pick {
  TokenId token = 0;
  bool has_lp = false;
  TokenLogprob lp;
  std::vector<TokenLogprob> top;
  std::string error;  // non-empty: the request fails
};

struct Block {
  std::vector<TokenId> prefix;  // every token up to the block's end (verified on a hit)
  std::vector<uint8_t> kv;      // KVCache::read_block of the block's positions (bytes as stored)
  std::list<uint64_t>::iterator lru;
};

}  // namespace

struct Scheduler::Impl {
  const model::Decoder& decoder;
  const Tokenizer& tok;
  SchedulerOptions opt;
  int64_t context = 0, vocab = 0, allowed_vocab = 0;
  std::vector<TokenId> base_eos;

  // Shared with the API threads.
  mutable std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<Queued> queue;
  std::unordered_set<RequestId> cancels;
  bool cancel_all = false, draining = false, stopping = false;
  RequestId next_id = 1;
  int64_t in_flight = 0;  // submitted and not yet over
  SchedulerStats snap;
  std::vector<SlotInfo> slot_snap;

  // Loop thread only.
  std::optional<model::KVCache> cache;
  std::vector<Request*> slot_owner;  // per slot
  std::vector<int> slot_seq;
  std::vector<int64_t> free_slots;
  std::list<std::unique_ptr<Request>> active;  // admission order
  std::unordered_map<uint64_t, Block> blocks;
  std::list<uint64_t> lru;  // most recent first
  SchedulerStats st;
  std::vector<Pick> picks;  // per decode row, reused
  std::vector<int64_t> rows, ids;
  std::vector<Seq*> row_seq;
  std::thread thread;

  Impl(const model::Decoder& d, const Tokenizer& t, SchedulerOptions o) : decoder(d), tok(t), opt(std::move(o)) {
    opt.validate();
    const auto& config = decoder.config();
    const int64_t mpe = config.max_position_embeddings;
    CORELM_CHECK(opt.context <= mpe, ValueError, "scheduler option context (", opt.context,
                 ") exceeds the model's max_position_embeddings (", mpe, ")");
    context = opt.context > 0 ? opt.context : std::min<int64_t>(mpe, 4096);
    CORELM_CHECK(context >= 2, ValueError, "scheduler: a context of ", context, " positions leaves no room to generate");
    vocab = config.vocab_size;
    allowed_vocab = std::min<int64_t>(vocab, static_cast<int64_t>(tok.vocab_size()));
    if (tok.eos_id()) base_eos.push_back(*tok.eos_id());
    if (config.eos_token_id >= 0) base_eos.push_back(static_cast<TokenId>(config.eos_token_id));
    cache.emplace(decoder.make_cache(opt.slots, context));  // typed as the decoder's kv_cache_types
    slot_owner.assign(static_cast<size_t>(opt.slots), nullptr);
    slot_seq.assign(static_cast<size_t>(opt.slots), 0);
    for (int64_t s = opt.slots; s-- > 0;) free_slots.push_back(s);  // lowest slot first (back)
    st.slots = opt.slots;
    st.kv_tokens_capacity = opt.slots * context;
    snap = st;
    update_snapshot_locked();
    thread = std::thread([this] { loop(); });
  }

  // ---- API side -------------------------------------------------------------------------------

  void validate(const SequenceRequest& r) const {
    CORELM_CHECK(!r.prompt.empty(), ValueError, "prompt is empty: give at least one token");
    CORELM_CHECK(static_cast<int64_t>(r.prompt.size()) < context, ValueError, "prompt has ", r.prompt.size(),
                 " tokens; the context is ", context, " positions, so at most ", context - 1, " fit");
    for (TokenId id : r.prompt)
      CORELM_CHECK(id >= 0 && id < vocab, ValueError, "prompt: token id ", id, " is outside the model's vocabulary (",
                   vocab, ")");
    CORELM_CHECK(r.n >= 1 && r.n <= opt.slots, ValueError, "n must be in [1, ", opt.slots, "] (the slots; got ", r.n, ")");
    CORELM_CHECK(r.max_new_tokens >= 0, ValueError, "max_new_tokens must be >= 0 (got ", r.max_new_tokens, ")");
    CORELM_CHECK(r.top_logprobs >= -1 && r.top_logprobs <= 20, ValueError,
                 "top_logprobs must be in [0, 20] (or -1 for no logprobs; got ", r.top_logprobs, ")");
    for (const auto& [id, bias] : r.logit_bias) {
      CORELM_CHECK(id >= 0 && id < vocab, ValueError, "logit_bias: token id ", id, " is outside the model's vocabulary (",
                   vocab, ")");
      CORELM_CHECK(std::isfinite(bias), ValueError, "logit_bias: the bias of token ", id, " is not finite");
    }
    CORELM_CHECK(std::isfinite(r.presence_penalty), ValueError, "presence_penalty must be finite");
    CORELM_CHECK(std::isfinite(r.frequency_penalty), ValueError, "frequency_penalty must be finite");
    for (const auto& s : r.stop) CORELM_CHECK(!s.empty(), ValueError, "stop strings must not be empty");
    for (TokenId id : r.eos_ids)
      CORELM_CHECK(id >= 0 && id < vocab, ValueError, "eos_ids: token id ", id, " is outside the model's vocabulary (",
                   vocab, ")");
    r.sampling.validate();
  }

  RequestId submit(SequenceRequest r, std::shared_ptr<RequestObserver> obs) {
    validate(r);
    CORELM_CHECK(obs != nullptr, ValueError, "scheduler: submit needs an observer");
    std::lock_guard<std::mutex> lock(mu);
    if (draining || stopping) throw DrainingError("scheduler: draining, not accepting requests");
    if (static_cast<int64_t>(queue.size()) >= opt.max_queue)
      throw QueueFullError(detail::concat("scheduler: the queue is full (", queue.size(), " requests waiting)"));
    const RequestId id = next_id++;
    // Kept sorted by priority, FIFO within one: a request goes behind every waiting one of its
    // priority or higher, so admission (from the front) needs no search.
    auto pos = queue.end();
    while (pos != queue.begin() && std::prev(pos)->req.priority < r.priority) --pos;
    queue.insert(pos, Queued{id, std::move(r), std::move(obs)});
    ++in_flight;
    snap.queued = static_cast<int64_t>(queue.size());
    wake.notify_one();
    return id;
  }

  void cancel(RequestId id) {
    std::lock_guard<std::mutex> lock(mu);
    cancels.insert(id);
    wake.notify_one();
  }

  bool drain(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu);
    draining = true;
    if (idle.wait_until(lock, deadline, [&] { return in_flight == 0; })) return true;
    cancel_all = true;
    wake.notify_one();
    idle.wait(lock, [&] { return in_flight == 0; });
    return false;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
      cancel_all = true;
      wake.notify_one();
    }
    if (thread.joinable()) thread.join();
  }

  // ---- loop -----------------------------------------------------------------------------------

  void loop() {
    autograd::NoGradGuard no_grad;
    for (;;) {
      std::vector<Queued> admitted, dropped;
      std::unordered_set<RequestId> to_cancel;
      bool all = false, stop_now = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stopping || cancel_all || !cancels.empty() || !active.empty() || !queue.empty(); });
        all = cancel_all;
        cancel_all = false;
        stop_now = stopping;
        to_cancel.swap(cancels);
        for (auto it = queue.begin(); it != queue.end();) {
          if (all || to_cancel.count(it->id)) {
            dropped.push_back(std::move(*it));
            it = queue.erase(it);
          } else {
            ++it;
          }
        }
        // In queue order (priority, then arrival): a request waits until it fits, and nothing
        // behind it overtakes it.
        int64_t free_n = static_cast<int64_t>(free_slots.size());
        while (!queue.empty() && queue.front().req.n <= free_n) {
          free_n -= queue.front().req.n;
          admitted.push_back(std::move(queue.front()));
          queue.pop_front();
        }
        snap.queued = static_cast<int64_t>(queue.size());
      }
      int64_t over = 0;
      for (Queued& q : dropped) {
        for (int i = 0; i < q.req.n; ++i) guard_callback([&] { q.obs->on_finished(i, "cancelled", "", 0); });
        ++st.requests_cancelled;
        ++over;
      }
      for (auto& r : active)
        if (all || to_cancel.count(r->id)) cancel_request(*r);
      for (Queued& q : admitted) admit(std::move(q));
      if (!stop_now) step();
      over += reap();
      {
        std::lock_guard<std::mutex> lock(mu);
        in_flight -= over;
        update_snapshot_locked();
        if (in_flight == 0) idle.notify_all();
        if (stop_now && queue.empty() && active.empty()) return;
      }
    }
  }

  // Observer code must not take the loop down with it.
  template <class F>
  static void guard_callback(F&& f) {
    try {
      f();
    } catch (...) {
    }
  }

  std::vector<TokenId> eos_of(const SequenceRequest& r) const {
    std::vector<TokenId> e;
    if (!r.stop_at_eos) return e;
    e = base_eos;
    e.insert(e.end(), r.eos_ids.begin(), r.eos_ids.end());
    return e;
  }

  void admit(Queued q) {
    auto owned = std::make_unique<Request>();
    Request& r = *owned;
    r.id = q.id;
    r.req = std::move(q.req);
    r.obs = std::move(q.obs);
    r.prompt_len = static_cast<int64_t>(r.req.prompt.size());
    r.eos = eos_of(r.req);
    st.prompt_tokens += static_cast<uint64_t>(r.prompt_len);
    const SequenceRequest& req = r.req;
    r.plain = req.sampling.is_plain_argmax() && req.top_logprobs < 0 && !req.grammar && req.logit_bias.empty() &&
              req.presence_penalty == 0 && req.frequency_penalty == 0;
    try {
      for (int i = 0; i < req.n; ++i) {
        auto s = std::make_unique<Seq>(i, req.sampling, req.seed + static_cast<uint64_t>(i), req.prompt, tok, req.stop,
                                       allowed_vocab);
        s->owner = &r;
        // The other choices clone the first one's constraint (shares its vocabulary index and masks).
        if (req.grammar) {
          if (i == 0) s->constraint.emplace(req.grammar, tok, r.eos);
          else s->constraint.emplace(r.seqs[0]->constraint->clone());
        }
        r.seqs.push_back(std::move(s));
      }
    } catch (const std::exception& e) {
      active.push_back(std::move(owned));
      fail(r, e.what());
      return;
    }
    active.push_back(std::move(owned));
    if (req.max_new_tokens == 0) {  // nothing to compute
      r.prefilling = false;
      guard_callback([&] { r.obs->on_prefilled(r.prompt_len, 0); });
      for (auto& s : r.seqs) finish_seq(r, *s, "length");
      return;
    }
    for (auto& s : r.seqs) {
      s->slot = free_slots.back();
      free_slots.pop_back();
      slot_owner[static_cast<size_t>(s->slot)] = &r;
      slot_seq[static_cast<size_t>(s->slot)] = s->index;
    }
    const int64_t row = r.seqs[0]->slot;
    cache->set_length(row, 0);
    // The longest run of cached blocks that ends before the last prompt token (always computed:
    // its logits pick the first token).
    const int64_t C = opt.prefill_chunk;
    // A cache with sliding-window rings or linear-attention states has no separable position
    // blocks: such a model runs without the prefix cache.
    if (opt.prefix_cache_blocks > 0 && cache->supports_prefix_blocks()) {
      while ((r.pos + C) <= r.prompt_len - 1) {
        const uint64_t h = hash_tokens(r.hash, req.prompt.data() + r.pos, C);
        auto it = blocks.find(h);
        if (it == blocks.end()) break;
        Block& b = it->second;
        if (static_cast<int64_t>(b.prefix.size()) != r.pos + C ||
            !std::equal(b.prefix.begin(), b.prefix.end(), req.prompt.begin()))
          break;
        cache->write_block(row, r.pos, C, b.kv.data());
        r.block_keys.push_back(h);
        r.hash = h;
        r.pos += C;
        r.hashed = r.pos;
      }
      touch_chain(r);
      cache->set_length(row, r.pos);
      r.cached = r.pos;
      st.prefix_cache_hit_tokens += static_cast<uint64_t>(r.cached);
    }
  }

  void free_slot(Seq& s) {
    if (s.slot < 0) return;
    slot_owner[static_cast<size_t>(s.slot)] = nullptr;
    cache->set_length(s.slot, 0);
    free_slots.push_back(s.slot);
    // Keep the lowest free slot at the back (a deterministic, compact assignment).
    std::sort(free_slots.begin(), free_slots.end(), std::greater<>());
    s.slot = -1;
  }

  void finish_seq(Request& r, Seq& s, const char* reason) {
    if (s.done) return;
    s.done = true;
    free_slot(s);
    const bool cancelled = std::string(reason) == "cancelled";
    std::string piece = s.text.finish(reason, !cancelled);
    const std::string text = cancelled ? s.text.streamed_text() : s.text.text();
    if (!piece.empty()) guard_callback([&] { r.obs->on_token(s.index, s.context.back(), piece, nullptr, nullptr); });
    guard_callback([&] { r.obs->on_finished(s.index, s.text.finish_reason(), text, s.generated); });
  }

  void cancel_request(Request& r) {
    if (r.gone) return;
    for (auto& s : r.seqs) finish_seq(r, *s, "cancelled");
    r.gone = true;
    ++st.requests_cancelled;
  }

  void fail(Request& r, const std::string& message) {
    if (r.gone) return;
    for (auto& s : r.seqs) {
      s->done = true;
      free_slot(*s);
    }
    r.gone = true;
    guard_callback([&] { r.obs->on_error(message); });
  }

  // Removes finished requests; returns how many left.
  int64_t reap() {
    int64_t n = 0;
    for (auto it = active.begin(); it != active.end();) {
      Request& r = **it;
      if (!r.gone && std::all_of(r.seqs.begin(), r.seqs.end(), [](const auto& s) { return s->done; })) {
        r.gone = true;
        ++st.requests_finished;
      }
      if (r.gone) {
        it = active.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  // ---- one step -------------------------------------------------------------------------------

  void step() {
    bool worked = false;
    // Decode: every decoding row, one token each, in one forward.
    rows.clear();
    ids.clear();
    row_seq.clear();
    bool plain = true;
    for (auto& rp : active) {
      Request& r = *rp;
      if (r.gone || r.prefilling) continue;
      for (auto& s : r.seqs)
        if (!s->done) {
          rows.push_back(s->slot);
          ids.push_back(s->context.back());
          row_seq.push_back(s.get());
          plain = plain && r.plain;
        }
    }
    if (!rows.empty()) {
      worked = true;
      decode(rows, ids, row_seq, plain);
    }

    // Prefill: chunks in admission order within the budget; the first chunk always runs so a
    // step full of decode rows cannot starve prefill.
    int64_t used = static_cast<int64_t>(rows.size());
    std::map<int64_t, std::vector<Request*>> full;  // chunk length -> requests (not their last chunk)
    std::vector<std::pair<int64_t, Request*>> last;  // (length, request): last chunks
    bool any = false;
    for (auto& rp : active) {
      Request& r = *rp;
      if (r.gone || !r.prefilling) continue;
      const int64_t C = opt.prefill_chunk;
      const int64_t end = std::min((r.pos / C + 1) * C, r.prompt_len);
      const int64_t len = end - r.pos;
      if (any && used + len > opt.step_token_budget) break;
      any = true;
      used += len;
      if (end == r.prompt_len) last.emplace_back(len, &r);
      else full[len].push_back(&r);
    }
    for (auto& [len, reqs] : full) {
      worked = true;
      prefill(reqs, len, false);
    }
    // Last chunks have any length: they share a forward right-padded to the longest (padding is
    // never attended to, the rows' lengths are set back), as long as the padding at most doubles
    // the work and stays inside the slots' context.
    std::stable_sort(last.begin(), last.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (size_t i = 0; i < last.size();) {
      const int64_t T = last[i].first;
      std::vector<Request*> group{last[i].second};
      int64_t real = T;
      size_t j = i + 1;
      for (; j < last.size(); ++j) {
        const auto [len, r] = last[j];
        if (static_cast<int64_t>(group.size() + 1) * T > 2 * (real + len) || r->pos + T > context) break;
        group.push_back(r);
        real += len;
      }
      worked = true;
      prefill(group, T, true);
      i = j;
    }
    if (worked) ++st.steps;
  }

  // Runs `f` on the whole batch; when it throws (out of memory, ...) retries each row alone so
  // that only the requests that fail by themselves get the error.
  template <class Run, class OnFail>
  void guarded(const std::vector<int64_t>& batch_rows, size_t count, Run&& run, OnFail&& on_fail) {
    std::vector<int64_t> saved(batch_rows.size());
    for (size_t i = 0; i < batch_rows.size(); ++i) saved[i] = cache->length(batch_rows[i]);
    try {
      run(std::vector<size_t>{});
      return;
    } catch (const std::exception& e) {
      for (size_t i = 0; i < batch_rows.size(); ++i) cache->set_length(batch_rows[i], saved[i]);
      if (count == 1) {
        on_fail(0, e.what());
        return;
      }
    }
    for (size_t i = 0; i < count; ++i) {
      try {
        run(std::vector<size_t>{i});
      } catch (const std::exception& e) {
        cache->set_length(batch_rows[i], saved[i]);
        on_fail(i, e.what());
      }
    }
  }

  void decode(const std::vector<int64_t>& drows, const std::vector<int64_t>& dids, const std::vector<Seq*>& seqs,
              bool plain) {
    guarded(
        drows, drows.size(),
        [&](const std::vector<size_t>& only) {
          std::vector<int64_t> sub_rows, sub_ids;
          const std::vector<int64_t>* rr = &drows;
          const std::vector<int64_t>* ii = &dids;
          size_t first = 0;
          if (!only.empty()) {
            first = only[0];
            sub_rows = {drows[first]};
            sub_ids = {dids[first]};
            rr = &sub_rows;
            ii = &sub_ids;
          }
          const int64_t b = static_cast<int64_t>(rr->size());
          const Tensor step_ids = Tensor::from_vector(*ii, {b, 1});
          if (plain) {
            const std::vector<int64_t> next = decoder.forward_cached_argmax(step_ids, *cache, *rr, allowed_vocab);
            for (int64_t i = 0; i < b; ++i) take_guarded(*seqs[first + i], static_cast<TokenId>(next[i]), nullptr);
          } else {
            Tensor logits = decoder.forward_cached(step_ids, *cache, *rr, model::Logits::All).contiguous();
            const float* data = logits.data<float>();
            // Sampling is per row and independent: spread over the kernel thread pool (rows with a
            // grammar stay on this thread: constraint clones share a mask cache). Then the
            // tokens are taken in row order on this thread, which runs the callbacks.
            if (picks.size() < static_cast<size_t>(b)) picks.resize(static_cast<size_t>(b));
            auto pick_row = [&](int64_t i) {
              Seq& s = *seqs[first + i];
              Pick& p = picks[static_cast<size_t>(i)];
              p.error.clear();
              try {
                pick(*s.owner, s, data + i * vocab, p);
              } catch (const std::exception& e) {
                p.error = e.what();
                if (p.error.empty()) p.error = "sampling failed";
              }
            };
            parallel_for(b, 1, [&](int64_t lo, int64_t hi) {
              for (int64_t i = lo; i < hi; ++i)
                if (!seqs[first + i]->constraint) pick_row(i);
            });
            for (int64_t i = 0; i < b; ++i)
              if (seqs[first + i]->constraint) pick_row(i);
            for (int64_t i = 0; i < b; ++i) {
              Seq& s = *seqs[first + i];
              Request& r = *s.owner;
              if (s.done || r.gone) continue;
              const Pick& p = picks[static_cast<size_t>(i)];
              if (!p.error.empty()) {
                fail(r, p.error);
                continue;
              }
              try {
                take(r, s, p.token, &p);
              } catch (const std::exception& e) {
                fail(r, e.what());
              }
            }
          }
        },
        [&](size_t i, const std::string& msg) { fail(*seqs[i]->owner, msg); });
  }

  // One forward over the next chunk of each request, right-padded to `T` tokens; `final`: the
  // requests' last chunks, whose last real positions give the first tokens' logits.
  void prefill(const std::vector<Request*>& reqs, int64_t T, bool final) {
    const int64_t C = opt.prefill_chunk;
    auto chunk_len = [&](const Request* r) { return std::min((r->pos / C + 1) * C, r->prompt_len) - r->pos; };
    // Sliding-window rings and linear-attention states cannot forget padding: such a cache runs
    // one forward per chunk length instead of one padded forward.
    if (!cache->supports_prefix_blocks()) {
      std::map<int64_t, std::vector<Request*>> by_len;
      for (Request* r : reqs) by_len[chunk_len(r)].push_back(r);
      if (by_len.size() > 1 || by_len.begin()->first != T) {
        for (const auto& [len, group] : by_len) prefill(group, len, final);
        return;
      }
    }
    std::vector<int64_t> prows;
    for (Request* r : reqs) prows.push_back(r->seqs[0]->slot);
    guarded(
        prows, reqs.size(),
        [&](const std::vector<size_t>& only) {
          std::vector<Request*> sub;
          if (only.empty()) sub = reqs;
          else sub = {reqs[only[0]]};
          const int64_t b = static_cast<int64_t>(sub.size());
          const int64_t t = only.empty() ? T : chunk_len(sub[0]);
          std::vector<int64_t> rr(static_cast<size_t>(b)), lens(static_cast<size_t>(b));
          ids.assign(static_cast<size_t>(b * t), 0);
          bool padded = false;
          for (int64_t i = 0; i < b; ++i) {
            rr[i] = sub[i]->seqs[0]->slot;
            lens[i] = chunk_len(sub[i]);
            padded = padded || lens[i] != t;
            std::copy_n(sub[i]->req.prompt.begin() + sub[i]->pos, lens[i], ids.begin() + i * t);
          }
          const Tensor chunk = Tensor::from_vector(ids, {b, t});
          Tensor logits;
          if (!final) {
            decoder.forward_cached(chunk, *cache, rr, model::Logits::None);
          } else if (!padded) {
            logits = decoder.forward_cached(chunk, *cache, rr, model::Logits::Last).contiguous();
          } else {
            // The LM head on each row's last real position: the same bits as Logits::Last.
            const Tensor hidden = decoder.forward_cached(chunk, *cache, rr, model::Logits::None).contiguous();
            const int64_t H = hidden.size(2);
            Tensor at = Tensor::empty({b, H});
            for (int64_t i = 0; i < b; ++i)
              std::copy_n(hidden.data<float>() + (i * t + lens[i] - 1) * H, H, at.data<float>() + i * H);
            logits = decoder.logits_from_hidden(at).contiguous();
          }
          for (int64_t i = 0; i < b; ++i) {
            Request& r = *sub[i];
            try {
              cache->set_length(rr[i], r.pos + lens[i]);  // forget the padding
              prefilled_chunk(r, lens[i]);
              if (final) first_tokens(r, logits.data<float>() + i * vocab);
            } catch (const std::exception& e) {
              fail(r, e.what());
            }
          }
        },
        [&](size_t i, const std::string& msg) { fail(*reqs[i], msg); });
  }

  // The chunk [pos, pos + len) is in the first slot: a full block goes to the prefix cache.
  void prefilled_chunk(Request& r, int64_t len) {
    const int64_t C = opt.prefill_chunk;
    const int64_t begin = r.pos;
    r.pos += len;
    if (opt.prefix_cache_blocks == 0 || !cache->supports_prefix_blocks() || len != C || begin % C != 0) return;
    r.hash = hash_tokens(r.hash, r.req.prompt.data() + r.hashed, r.pos - r.hashed);
    r.hashed = r.pos;
    auto it = blocks.find(r.hash);
    if (it != blocks.end() && static_cast<int64_t>(it->second.prefix.size()) == r.pos &&
        std::equal(it->second.prefix.begin(), it->second.prefix.end(), r.req.prompt.begin())) {
      r.block_keys.push_back(r.hash);
      touch_chain(r);
      return;
    }
    if (static_cast<int64_t>(r.block_keys.size()) != begin / C) return;  // a block before it is missing: unreachable
    if (it == blocks.end()) {
      std::vector<uint8_t> recycled;
      if (static_cast<int64_t>(blocks.size()) >= opt.prefix_cache_blocks) {
        // The least recently used block goes, unless it is one of this prompt's own (then the
        // cache is all this prompt's chain, and a deeper block is worth less than its parents).
        auto victim = blocks.find(lru.back());
        if (std::find(r.block_keys.begin(), r.block_keys.end(), victim->first) != r.block_keys.end()) return;
        recycled = std::move(victim->second.kv);
        blocks.erase(victim);
        lru.pop_back();
      }
      lru.push_front(r.hash);
      Block& b = blocks[r.hash];
      b.lru = lru.begin();
      b.kv = std::move(recycled);
      it = blocks.find(r.hash);
    }
    Block& b = it->second;  // new, or a hash collision with another prefix: overwritten
    b.prefix.assign(r.req.prompt.begin(), r.req.prompt.begin() + r.pos);
    b.kv.resize(static_cast<size_t>(cache->block_bytes(C)));
    cache->read_block(r.seqs[0]->slot, begin, C, b.kv.data());
    r.block_keys.push_back(r.hash);
    touch_chain(r);
  }

  // Most recent first, a prompt's blocks from position 0 ahead of the deeper ones: eviction takes
  // the deepest first, so a kept block is always reachable (its parents are kept too).
  void touch_chain(const Request& r) {
    for (size_t i = r.block_keys.size(); i-- > 0;) {
      auto it = blocks.find(r.block_keys[i]);
      if (it != blocks.end()) lru.splice(lru.begin(), lru, it->second.lru);
    }
  }

  // Prefill done: the other sequences get the prompt's KV, and each samples its first token from
  // the last position's logits.
  void first_tokens(Request& r, const float* logits) {
    r.prefilling = false;
    guard_callback([&] { r.obs->on_prefilled(r.prompt_len, r.cached); });
    for (size_t i = 1; i < r.seqs.size(); ++i) cache->copy_row(r.seqs[0]->slot, r.seqs[i]->slot, r.prompt_len);
    for (auto& s : r.seqs) take_guarded(*s, -1, logits);
  }

  void take_guarded(Seq& s, TokenId token, const float* logits) {
    Request& r = *s.owner;
    if (s.done || r.gone) return;
    try {
      if (!logits) {
        take(r, s, token, nullptr);
        return;
      }
      Pick p;
      pick(r, s, logits, p);
      take(r, s, p.token, &p);
    } catch (const std::exception& e) {
      fail(r, e.what());
    }
  }

  // logits row -> token, with logit_bias, logprobs, penalties, the grammar mask and the sampler.
  // Touches only the sequence's own state and per-thread buffers, so rows without a grammar are
  // picked in parallel.
  void pick(const Request& r, Seq& s, const float* logits, Pick& out) const {
    const SequenceRequest& q = r.req;
    thread_local std::vector<float> x_buf, lp_buf;
    x_buf.resize(static_cast<size_t>(vocab));
    float* x = x_buf.data();
    std::copy_n(logits, vocab, x);
    const std::span<float> row(x, static_cast<size_t>(allowed_vocab));
    for (const auto& [id, bias] : q.logit_bias)
      if (id < allowed_vocab) x[id] += bias;
    double lse = 0;
    out.has_lp = q.top_logprobs >= 0;
    if (out.has_lp) {
      lp_buf.assign(x, x + allowed_vocab);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < allowed_vocab; ++i) m = std::max(m, x[i]);
      double sum = 0;
      for (int64_t i = 0; i < allowed_vocab; ++i) sum += std::exp(double(x[i]) - double(m));
      lse = double(m) + std::log(sum);
    }
    if (q.presence_penalty != 0 || q.frequency_penalty != 0)
      for (const auto& [id, c] : s.counts)
        if (id < allowed_vocab) x[id] -= q.presence_penalty + q.frequency_penalty * static_cast<float>(c);
    if (s.constraint) s.constraint->mask(row, remaining(r, s));
    const TokenId token = s.sampler.sample(row, s.context, allowed_vocab);
    out.token = token;
    out.top.clear();
    if (out.has_lp) {
      out.lp = TokenLogprob{token, static_cast<float>(double(lp_buf[token]) - lse)};
      const size_t k = static_cast<size_t>(q.top_logprobs);
      if (k > 0) {
        // The k best by (logit desc, id asc), kept sorted in a small array.
        auto better = [](const TokenLogprob& a, const TokenLogprob& b) {
          return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
        };
        auto& top = out.top;
        for (int64_t i = 0; i < allowed_vocab; ++i) {
          const TokenLogprob c{static_cast<TokenId>(i), lp_buf[i]};
          if (top.size() == k && !better(c, top.back())) continue;
          top.insert(std::upper_bound(top.begin(), top.end(), c, better), c);
          if (top.size() > k) top.pop_back();
        }
        for (auto& t : top) t.logprob = static_cast<float>(double(t.logprob) - lse);
      }
    }
  }

  // Tokens this sequence may still produce, this one included.
  int64_t remaining(const Request& r, const Seq& s) const {
    return std::min(r.req.max_new_tokens - s.generated, context - static_cast<int64_t>(s.context.size()));
  }

  void take(Request& r, Seq& s, TokenId token, const Pick* p) {
    const bool eos = std::find(r.eos.begin(), r.eos.end(), token) != r.eos.end();
    s.context.push_back(token);
    ++s.generated;
    ++st.generated_tokens;
    if (r.req.presence_penalty != 0 || r.req.frequency_penalty != 0) {
      auto it = std::find_if(s.counts.begin(), s.counts.end(), [&](const auto& p) { return p.first == token; });
      if (it == s.counts.end()) s.counts.emplace_back(token, 1);
      else ++it->second;
    }
    bool grammar_done = false;
    if (s.constraint && !eos) {
      s.constraint->accept(token);
      grammar_done = s.constraint->finished();
    }
    const bool out_of_budget =
        s.generated >= r.req.max_new_tokens || static_cast<int64_t>(s.context.size()) >= context;
    const char* end = grammar_done ? "stop" : out_of_budget ? "length" : nullptr;
    const std::string piece = s.text.accept(token, eos, end);
    const bool lp = p && p->has_lp;
    guard_callback([&] { r.obs->on_token(s.index, token, piece, lp ? &p->lp : nullptr, lp ? &p->top : nullptr); });
    if (s.text.finished()) {
      s.done = true;
      free_slot(s);
      guard_callback([&] { r.obs->on_finished(s.index, s.text.finish_reason(), s.text.text(), s.generated); });
    }
  }

  // ---- snapshots ------------------------------------------------------------------------------

  void update_snapshot_locked() {
    SchedulerStats s = st;
    s.queued = static_cast<int64_t>(queue.size());
    s.running = 0;
    s.slots_busy = 0;
    s.kv_tokens_used = 0;
    for (auto& r : active)
      if (!r->gone) ++s.running;
    slot_snap.resize(static_cast<size_t>(opt.slots));
    for (int64_t i = 0; i < opt.slots; ++i) {
      SlotInfo& info = slot_snap[static_cast<size_t>(i)];
      info = SlotInfo{};
      info.slot = i;
      const Request* r = slot_owner[static_cast<size_t>(i)];
      if (!r) {
        info.state = "idle";
        continue;
      }
      ++s.slots_busy;
      info.request = r->id;
      info.index = slot_seq[static_cast<size_t>(i)];
      info.state = r->prefilling ? "prefill" : "decode";
      info.prompt_tokens = r->prompt_len;
      info.cached_tokens = r->cached;
      info.generated_tokens = r->seqs[static_cast<size_t>(info.index)]->generated;
      info.kv_tokens = cache->length(i);
      s.kv_tokens_used += info.kv_tokens;
    }
    s.prefix_cache_blocks = static_cast<int64_t>(blocks.size());
    snap = s;
  }
};

Scheduler::Scheduler(const model::Decoder& decoder, const Tokenizer& tokenizer, SchedulerOptions options)
    : impl_(std::make_unique<Impl>(decoder, tokenizer, std::move(options))) {}

Scheduler::~Scheduler() { impl_->stop(); }

RequestId Scheduler::submit(SequenceRequest request, std::shared_ptr<RequestObserver> observer) {
  return impl_->submit(std::move(request), std::move(observer));
}

void Scheduler::cancel(RequestId id) { impl_->cancel(id); }

bool Scheduler::drain(std::chrono::steady_clock::time_point deadline) { return impl_->drain(deadline); }

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->snap;
}

std::vector<SlotInfo> Scheduler::slots() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->slot_snap;
}

const SchedulerOptions& Scheduler::options() const { return impl_->opt; }

int64_t Scheduler::context() const { return impl_->context; }

}  // namespace corelm::infer
