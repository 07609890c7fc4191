// ChatTemplate: the public face of the Jinja-subset renderer (jinja_parser.cc, jinja_eval.cc).
#include "corelm/chat_template.h"

#include "infer/jinja_ast.h"

namespace corelm::infer {

struct ChatTemplate::Impl {
  std::string source;
  jinja::Program program;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->program = jinja::parse(source);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::json& context) const {
  if (!context.is_object())
    throw TemplateError(std::string("chat template: the render context must be a JSON object, got ") + context.type_name());
  return jinja::render(impl_->program, context);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object())
    throw TemplateError(std::string("chat template: the render context must be a JSON object, got ") + context.type_name());
  return jinja::render(impl_->program, context);
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token) const {
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  // What transformers' apply_chat_template passes besides the special tokens: tools and
  // documents are None when the caller gives none.
  const nlohmann::ordered_json context = {{"messages", std::move(msgs)},
                                  {"add_generation_prompt", add_generation_prompt},
                                  {"bos_token", bos_token},
                                  {"eos_token", eos_token},
                                  {"tools", nullptr},
                                  {"documents", nullptr}};
  return render(context);
}

const std::string& ChatTemplate::source() const { return impl_->source; }

const std::string& ChatTemplate::default_source() {
  static const std::string kChatML =
      "{%- for message in messages %}"
      "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}"
      "{{- '<|im_start|>assistant\\n' }}"
      "{%- endif %}";
  return kChatML;
}

}  // namespace corelm::infer
