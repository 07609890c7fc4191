// INTERIM (removed when h15/sched, h15/jinja and h15/constraint land): minimal stand-ins for
// infer::Scheduler (one request at a time through TextGenerator), infer::ChatTemplate (always
// ChatML) and infer::Grammar (unsupported), so the server links and can be tried early.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "corelm/chat_template.h"
#include "corelm/constraint.h"
#include "corelm/scheduler.h"

namespace corelm::infer {

void SchedulerOptions::validate() const {}

struct Scheduler::Impl {
  const model::Decoder& decoder;
  const Tokenizer& tokenizer;
  SchedulerOptions options;
  mutable std::mutex m;
  std::condition_variable cv;
  struct Job {
    RequestId id;
    SequenceRequest req;
    std::shared_ptr<RequestObserver> obs;
  };
  std::deque<Job> queue;
  RequestId next = 1, running = 0;
  std::atomic<RequestId> cancel_id{0};
  bool stop = false, draining = false;
  uint64_t finished = 0;
  std::thread worker;
  Impl(const model::Decoder& d, const Tokenizer& t, SchedulerOptions o) : decoder(d), tokenizer(t), options(o) {}
  int64_t ctx() const {
    return options.context > 0 ? options.context : std::min<int64_t>(4096, decoder.config().max_position_embeddings);
  }
  void loop() {
    TextGenerator gen(decoder, tokenizer);
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (stop) return;
        job = std::move(queue.front());
        queue.pop_front();
        running = job.id;
      }
      struct Cancelled {};
      job.obs->on_prefilled(static_cast<int64_t>(job.req.prompt.size()), 0);
      for (int i = 0; i < job.req.n; ++i) {
        GenerateOptions o;
        o.max_new_tokens = std::min<int64_t>(job.req.max_new_tokens, ctx() - static_cast<int64_t>(job.req.prompt.size()));
        o.sampling = job.req.sampling;
        o.seed = job.req.seed + static_cast<uint64_t>(i);
        o.stop = job.req.stop;
        o.eos_ids = job.req.eos_ids;
        try {
          auto r = gen.generate_ids({job.req.prompt}, o, [&](size_t, std::string_view piece) {
            if (cancel_id.load() == job.id) throw Cancelled{};
            job.obs->on_token(i, 0, std::string(piece), nullptr, nullptr);
          });
          job.obs->on_finished(i, r[0].finish_reason, r[0].text, static_cast<int64_t>(r[0].tokens.size()));
        } catch (const Cancelled&) {
          job.obs->on_finished(i, "cancelled", "", 0);
        } catch (const std::exception& e) {
          job.obs->on_error(e.what());
          break;
        }
      }
      std::lock_guard<std::mutex> lock(m);
      running = 0;
      ++finished;
      cv.notify_all();
    }
  }
};

Scheduler::Scheduler(const model::Decoder& decoder, const Tokenizer& tokenizer, SchedulerOptions options)
    : impl_(std::make_unique<Impl>(decoder, tokenizer, options)) {
  impl_->worker = std::thread([this] { impl_->loop(); });
}
Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    impl_->stop = true;
    impl_->cancel_id = impl_->running;
  }
  impl_->cv.notify_all();
  impl_->worker.join();
}
RequestId Scheduler::submit(SequenceRequest request, std::shared_ptr<RequestObserver> observer) {
  std::lock_guard<std::mutex> lock(impl_->m);
  if (impl_->draining) throw DrainingError("draining");
  if (static_cast<int64_t>(impl_->queue.size()) >= impl_->options.max_queue + (impl_->running ? 0 : 1))
    throw QueueFullError("queue full");
  CORELM_CHECK(!request.prompt.empty() && static_cast<int64_t>(request.prompt.size()) < impl_->ctx(), ValueError,
               "prompt length");
  const RequestId id = impl_->next++;
  impl_->queue.push_back({id, std::move(request), std::move(observer)});
  impl_->cv.notify_all();
  return id;
}
void Scheduler::cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(impl_->m);
  for (auto it = impl_->queue.begin(); it != impl_->queue.end(); ++it)
    if (it->id == id) {
      for (int i = 0; i < it->req.n; ++i) it->obs->on_finished(i, "cancelled", "", 0);
      impl_->queue.erase(it);
      return;
    }
  if (impl_->running == id) impl_->cancel_id = id;
}
bool Scheduler::drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(impl_->m);
  impl_->draining = true;
  return impl_->cv.wait_until(lock, deadline, [&] { return impl_->queue.empty() && impl_->running == 0; });
}
SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->m);
  SchedulerStats s;
  s.queued = static_cast<int64_t>(impl_->queue.size());
  s.running = impl_->running ? 1 : 0;
  s.slots = 1;
  s.slots_busy = s.running;
  s.requests_finished = impl_->finished;
  return s;
}
std::vector<SlotInfo> Scheduler::slots() const {
  std::lock_guard<std::mutex> lock(impl_->m);
  SlotInfo s;
  s.state = impl_->running ? "decode" : "idle";
  s.request = impl_->running;
  return {s};
}
const SchedulerOptions& Scheduler::options() const { return impl_->options; }
int64_t Scheduler::context() const { return impl_->ctx(); }

struct ChatTemplate::Impl {
  std::string source;
};
ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>(Impl{source})) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
std::string ChatTemplate::render(const nlohmann::json&) const { return ""; }
std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string&,
                                const std::string&) const {
  std::string s;
  for (const auto& m : messages) s += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) s += "<|im_start|>assistant\n";
  return s;
}
const std::string& ChatTemplate::source() const { return impl_->source; }
const std::string& ChatTemplate::default_source() {
  static const std::string s = "chatml";
  return s;
}

std::shared_ptr<const Grammar> Grammar::regex(const std::string&) { throw ValueError("regex: not available yet"); }
std::shared_ptr<const Grammar> Grammar::choices(const std::vector<std::string>&) { throw ValueError("choices: not available yet"); }
std::shared_ptr<const Grammar> Grammar::json_object() { throw ValueError("json_object: not available yet"); }
std::shared_ptr<const Grammar> Grammar::json_schema(const nlohmann::json&) { throw ValueError("json_schema: not available yet"); }

}  // namespace corelm::infer
