"""Chat-template oracle: renders every template of tests/data/chat_templates over a set of
conversations with Python's jinja2 configured the way transformers' apply_chat_template
configures it (transformers >= 4.43, utils/chat_template_utils.py: ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loopcontrols extension, a `{% generation %}` tag, a
tojson filter over json.dumps(ensure_ascii=False), and the raise_exception / strftime_now
globals), and writes {"cases": [{template, source, context, output | error}]} for
test_chat_template_oracle.cc, which renders the same with corelm's ChatTemplate and compares
byte for byte. The context holds what apply_chat_template passes: messages, tools and documents
(None when absent), add_generation_prompt and the special tokens.

The .venv's transformers (4.40) predates strftime_now and the tojson override, so the
environment is built here from jinja2 directly rather than through a tokenizer.
"""
import json
import os
import sys
from datetime import datetime

from oracle_fixture import NO_TORCH_EXIT, write_json

try:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja2 not found (Debian python3-jinja2)", file=sys.stderr)
    sys.exit(NO_TORCH_EXIT)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "data", "chat_templates")


class GenerationTag(Extension):
    """transformers' AssistantTracker without the mask bookkeeping: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# Special tokens of each model family (what tokenizer_config.json names).
TOKENS = {
    "meta-llama": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen": ("", "<|im_end|>"),
    "HuggingFaceTB": ("<|im_start|>", "<|im_end|>"),
    "mistralai": ("<s>", "</s>"),
    "google": ("<bos>", "<eos>"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather of a city, \"quoted\" & <tagged>",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
]


def msg(role, content):
    return {"role": role, "content": content}


def conversations():
    """(name, messages, add_generation_prompt, extra context) for every template."""
    U, A, S = (lambda c: msg("user", c)), (lambda c: msg("assistant", c)), (lambda c: msg("system", c))
    tricky = ("Quotes ' \" and backslash \\ and {{ braces }} {% tags %} <|im_end|>\nnew\r\nlines\ttab  "
              "  trailing spaces   ")
    unicode = "Grüße, 世界! 😀 — é\u00a0nbsp \u2028 sep"
    long = []
    for k in range(12):
        long += [U(f"question {k}"), A(f"answer {k}")]
    yield "user", [U("Hello!")], True, {}
    yield "user-no-prompt", [U("Hello!")], False, {}
    yield "system-user", [S("You are terse."), U("Hi")], True, {}
    yield "multi-turn", [S("Be kind."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")], True, {}
    yield "ends-with-assistant", [U("Hi"), A("Hello")], False, {}
    yield "no-system-multi", [U("a"), A("b"), U("c"), A("d"), U("e")], True, {}
    yield "tricky-content", [U(tricky), A("  padded answer  "), U("\n\nleading newlines")], True, {}
    yield "unicode", [S(unicode), U(unicode), A(unicode), U("ok")], True, {}
    yield "empty-content", [U(""), A(""), U(" ")], True, {}
    yield "long", long + [U("last")], True, {}
    yield "two-users", [U("one"), U("two")], True, {}  # non-alternating: Mistral / Gemma raise
    yield "assistant-first", [A("I start"), U("then you")], True, {}
    yield "system-only", [S("Only a system message")], True, {}
    yield "no-messages", [], True, {}
    yield "unknown-role", [U("hi"), msg("critic", "bad answer")], True, {}
    yield "date-string", [U("What day is it?")], True, {"date_string": "01 Jan 2025"}
    yield "tools", [S("Use tools when needed."), U("Weather in Paris?")], True, {"tools": TOOLS}
    yield "tools-no-system", [U("2+3?")], True, {"tools": TOOLS}
    call = {"id": "call12345", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    yield "tool-call-round-trip", [
        U("Weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21.5}"},
        U("Thanks, and in Rome?"),
    ], True, {"tools": TOOLS}
    yield "custom-tokens", [U("hi"), A("yo")], True, {"bos_token": "[BOS]", "eos_token": "[EOS]"}


def render(env, source, context):
    try:
        return {"output": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises the base TemplateError; jinja2's own failures are subclasses.
        kind = "raise_exception" if type(e) is jinja2.exceptions.TemplateError else type(e).__name__
        return {"error": kind, "message": str(e)}
    except Exception as e:  # TypeError & co. inside the template: transformers lets them through
        return {"error": type(e).__name__, "message": str(e)}


def main(out):
    env = environment()
    cases = []
    for name in sorted(os.listdir(TEMPLATES)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
            source = f.read()
        family = name.split("-")[0]
        bos, eos = TOKENS.get(family, ("", ""))
        for conv, messages, gen, extra in conversations():
            context = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": gen,
                       "bos_token": bos, "eos_token": eos, "unk_token": "<unk>", "pad_token": None}
            # A fixed date, so the fixture does not depend on the day it was made (one case
            # leaves it out and exercises strftime_now: see the C++ side).
            if name.startswith("meta-llama") and conv != "date-string":
                context["date_string"] = "26 Jul 2024"
            context.update(extra)
            case = {"template": name, "conversation": conv, "source": source, "context": context}
            case.update(render(env, source, context))
            cases.append(case)
    # strftime_now itself, compared on the C++ side against today's date.
    case = {"template": "<strftime_now>", "conversation": "strftime", "source": "{{ strftime_now('%d %b %Y') }}",
            "context": {}}
    case.update(render(env, case["source"], {}))
    cases.append(case)
    write_json(out, {"jinja2": jinja2.__version__, "cases": cases})


if __name__ == "__main__":
    main(sys.argv[1])
