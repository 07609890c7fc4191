// Chat templates: a model's own Jinja chat template (tokenizer_config.json `chat_template`, a
// chat_template.jinja file, GGUF `tokenizer.chat_template`) rendered by corelm's own small
// Jinja-subset renderer, as transformers' apply_chat_template renders it. Supported: text and
// {{ expr }} / {% stmt %} with whitespace control (-), for (with loop.index/index0/first/last/
// length, else), if/elif/else, set (incl. namespace()), literals (strings, numbers, lists, dicts,
// true/false/none), attribute and item access, slicing [a:b:c], `+ - * / // %`, `~`, comparisons,
// and/or/not, `in`/`not in`, `is defined/none/string/...` tests, inline `x if c else y`,
// filters trim/length/tojson/upper/lower/default/first/last/join/replace/list/string/int/items,
// string methods strip/lstrip/rstrip/split/startswith/endswith/upper/lower/title/replace, dict
// .items()/.get(), raise_exception(msg), strftime_now(fmt). Anything else is a TemplateError that
// names the construct and the line:column, raised when the template is parsed (or, for a name
// only known at render time, when it is rendered).
// See docs/CHAT-TEMPLATES.md (sources, subset, limits, the documented default template).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "corelm/error.h"

namespace corelm::infer {

// A template that uses an unsupported construct or fails while rendering (including the
// template's own raise_exception); the message names the construct and line:column.
class TemplateError : public ValueError {
 public:
  using ValueError::ValueError;
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" (others are passed through to the template)
  std::string content;
};

class ChatTemplate {
 public:
  // Parses once; TemplateError for syntax or an unsupported construct.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with `context` as the template's variables (messages, add_generation_prompt,
  // bos_token, eos_token, and anything else the caller adds). Thread-safe (const).
  std::string render(const nlohmann::json& context) const;
  // The same with the caller's key order kept: `x | tojson` prints a dict's keys in the order they
  // came (as Python's json.loads + json.dumps do); nlohmann::json sorts them.
  std::string render(const nlohmann::ordered_json& context) const;
  // The usual call: messages as [{"role","content"}], plus add_generation_prompt / bos / eos.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt, const std::string& bos_token,
                    const std::string& eos_token) const;

  const std::string& source() const;

  // The documented default for models without a template: ChatML
  // ("<|im_start|>{role}\n{content}<|im_end|>\n" per message, then "<|im_start|>assistant\n").
  static const std::string& default_source();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace corelm::infer
