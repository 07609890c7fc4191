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
# Optional: the templates of the shared data's tokenizer_config.json files (Llama 3, Qwen3).
SHARED_TOKENIZERS = os.path.join(HERE, "..", "..", "..", "shared", "data", "tokenizers")


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


# Small templates, one construct or corner each, rendered by both sides like the real ones.
SNIPPETS = [
    ("{{ x }}|{{ y }}|{{ z }}|{{ w }}", {"x": 1.0, "y": 1e16, "z": 1.5e-5, "w": 123.456}),
    ("{{ [0.1, 2.0, -0.0, 1e-4, 12345678901234567890.0] }}", {}),
    ("{{ ['it\\'s', 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', '\\x01'] }}", {}),
    ("{{ {'a': none, 'b': true, 'c': [1, {'d': 'e'}]} }}", {}),
    ("{{ 7 / 2 }} {{ 6 / 3 }} {{ -7 // 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 10 % -3 }}", {}),
    ("{{ 'abc'[1:] }}{{ 'abc'[-1] }}{{ 'héllo wörld'[::-2] }}{{ [1,2,3,4][1:-1] }}{{ [1,2,3][5:] }}", {}),
    ("{% for x in xs %}{{ loop.index }}/{{ loop.revindex0 }}{{ ',' if not loop.last }}{% endfor %}", {"xs": "abcd"}),
    ("{% for a, b in pairs %}{{ a }}={{ b }} {% else %}none{% endfor %}", {"pairs": [[1, 2], ["x", None]]}),
    ("{% for x in [] %}{% else %}empty{% endfor %}|{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("{% set ns = namespace(a=[]) %}{% for x in [1,2] %}{% set ns.a = ns.a + [x] %}{% endfor %}{{ ns.a }}", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% if a is defined and a %}A{% elif b is not none %}B{% else %}C{% endif %}", {"b": 0}),
    ("{{ none is none }}{{ x is string }}{{ 3 is odd }}{{ x is mapping }}{{ l is iterable }}{{ l is sequence }}", {"x": "s", "l": [1]}),
    ("{{ '  Hello World  ' | trim | lower }}|{{ 'hello big world' | title }}|{{ 'hELLO' | capitalize }}", {}),
    ("{{ xs | length }}{{ xs | first }}{{ xs | last }}{{ xs | join('-') }}{{ xs | reverse | list }}", {"xs": ["a", "b", "c"]}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}", {"d": {"z": [1, 2.5, None, True], "a": "é\"\n\u2028<&>'", "e": {}, "l": []}}),
    ("{{ s | tojson(ensure_ascii=true) }}{{ 'x' | tojson }}{{ 3 | tojson }}{{ none | tojson }}", {"s": "é😀\u0001"}),
    ("{{ d.items() | list }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.get('q', 'dflt') }}{{ d | items | list }}", {"d": {"b": 1, "a": 2}}),
    ("{{ ' a b  c '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'x'.split('x') }}", {}),
    ("{{ '--a--'.strip('-') }}{{ '  a  '.lstrip() }}|{{ '  a  '.rstrip() }}|{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x','c')) }}", {}),
    ("{{ 'a-b-c'.replace('-', '+', 1) }}{{ 'aaa' | replace('a', 'bb') }}{{ 'Hi There'.upper() }}{{ 'Hi'.lower() }}", {}),
    ("{{ x | default('d') }}{{ '' | default('e', true) }}{{ none | default('f') }}{{ 0 | default('g', boolean=true) }}", {}),
    ("{{ '5' | int + 1 }}{{ '2.7' | int }}{{ 'x' | int(7) }}{{ 3 | float }}{{ '1e3' | float }}{{ 4.9 | int }}", {}),
    ("{{ users | selectattr('active') | map(attribute='name') | join(',') }}|{{ users | rejectattr('active') | list | length }}",
     {"users": [{"name": "a", "active": True}, {"name": "b", "active": False}, {"name": "c", "active": 1}]}),
    ("{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}{{ [1,2,3,4] | select('even') | list }}{{ [1,2,3] | reject('odd') | list }}",
     {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("{{ [3,1,2] | sort }}{{ ['b','a'] | sort(reverse=true) }}{{ [1,1,2] | unique | list }}{{ [1,2,3] | sum }}{{ [4,2,8] | min }}{{ [4,2,8] | max }}", {}),
    ("{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, first=true) }}|{{ 'x\n\ny' | indent(1, blank=true) }}|{{ 'a\n' | indent(2) }}", {}),
    ("{{ 1 if true }}{{ 2 if false }}|{{ 'a' ~ none ~ 1 ~ [1] }}|{{ 'x' * 3 }}{{ [0] * 2 }}", {}),
    ("{{ 'ab' in 'xaby' }}{{ 1 in [1.0] }}{{ 'k' in d }}{{ 'z' not in d }}{{ true == 1 }}{{ [1,2] == [1,2] }}{{ 'a' < 'b' }}", {"d": {"k": 1}}),
    ("{{ nope }}|{{ d.missing }}|{{ d['missing'] | default('m') }}|{{ nope | length }}|{{ nope is defined }}", {"d": {}}),
    ("{% for m in msgs if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% endfor %}", {"msgs": [{"role": "system"}, {"role": "user"}, {"role": "assistant"}]}),
    ("{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("{% for x in xs %}{{ loop.cycle('a', 'b') }}{{ loop.previtem | default('^') }}{{ loop.nextitem | default('$') }} {% endfor %}", {"xs": [1, 2, 3]}),
    ("{% set a, b = 'xy' %}{{ b }}{{ a }}{% set t = (1, 2) %}{{ t }}{% set c %}cap{{ 1 }}{% endset %}{{ c | upper }}", {}),
    ("a\n  {% if true %}\n  b\n  {% endif %}\n  c\n{# comment #}\nd  {#- trim -#}  e\n{%- if true %} f {% endif -%}\n g", {}),
    ("  {%+ if true %}keep{% endif %}\n{{- ' v ' -}}\n  {% raw_not_a_tag = 1 if false else 2 %}", None),
    ("line1\r\nline2\rline3\n", {}),
    ("{{ \"a\\u00e9\\x41\\101\\q\" }}{{ 'a' 'b' \"c\" }}", {}),
    ("{{ 9223372036854775807 }}{{ -1 | abs }}{{ 2.5 | round }}{{ 3.14159 | round(2) }}{{ 7 | round(method='floor') }}", {}),
    ("{{ raise_exception('custom failure: ' ~ 42) }}", {}),
    ("{{ x.y.z }}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{% for x in 5 %}{% endfor %}", {}),
    ("{{ [1,2][0:1:0] }}", {}),
    ("{{ d | tojson }}", {"d": {"f": float("1e300"), "g": 0.1, "h": -2}}),
    ("{{ 'héllo' | length }}{{ 'héllo' | upper }}{{ 'x' | center(5) if false else 'no-center' }}", {}),
    ("{% generation %}in generation{% endgeneration %}", {}),
    ("{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ s.title() }}|{{ s is lower }}{{ 'ÀB' is upper }}",
     {"s": "àéîõüÿ ĀăĹľŸžſ αβγΣςάέ абвЁё straße µ x-y(z) 中文"}),
    ("{{ '%s=%d %r %.2f %f %%' % ('a', 3.9, 'q', 2.345, 1) }}|{{ '%s' % none }}|{{ '%s and %s' | format('x', [1]) }}|{{ '%d' % true }}", {}),
    ("{{ '%s %s' % ('one',) }}", {}),
    ("{{ 'x' | center(6) }}|{{ 'ab' | center(7) }}|{{ 'é' | center(4) }}", {}),
    ("{{ [1, 2, 3] | map('string') | join }}{{ ['a', 'b'] | map('upper') | list }}", {}),
    ("{{ tools | length if tools else 'no tools' }}{{ documents is none }}", {"tools": None, "documents": None}),
]


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
    sources = []
    for name in sorted(os.listdir(TEMPLATES)):
        if name.endswith(".jinja"):
            with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
                source = f.read()
            sources.append((name, source) + TOKENS.get(name.split("-")[0], ("", "")))
    for tok in ("llama3", "qwen3"):
        path = os.path.join(SHARED_TOKENIZERS, tok, "tokenizer_config.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
            if isinstance(cfg.get("chat_template"), str):
                sources.append((f"shared/{tok}", cfg["chat_template"], cfg.get("bos_token") or "", cfg.get("eos_token") or ""))
    for name, source, bos, eos in sources:
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
    for k, (source, context) in enumerate(SNIPPETS):
        if context is None:
            continue  # documents a construct both sides reject at parse time; see the C++ unit tests
        case = {"template": "<snippet>", "conversation": f"snippet {k}", "source": source, "context": context}
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
