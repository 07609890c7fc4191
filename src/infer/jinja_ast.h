// The parsed form of a chat template: jinja2's lexing rules (trim_blocks and lstrip_blocks on,
// as transformers configures them; `-` / `+` whitespace control; one trailing newline dropped;
// \r\n and \r read as \n) and the expression grammar of jinja2's parser, restricted to the
// subset listed in include/corelm/chat_template.h. Not a public contract.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "infer/jinja_value.h"

namespace corelm::infer::jinja {

struct Pos {
  int line = 1, col = 1;
};

// Bounds that keep a hostile or broken template from exhausting the stack, memory or time.
struct Limits {
  static constexpr int kMaxNesting = 64;              // nested expressions / blocks while parsing and rendering
  static constexpr int kMaxHeight = 256;              // expression tree height (a+a+...+a chains)
  static constexpr size_t kMaxSourceBytes = 1 << 20;  // template source
  static constexpr size_t kMaxOutputBytes = 16 << 20; // rendered text and any string built on the way
  static constexpr size_t kMaxItems = 1 << 20;        // elements of a list built by the template (range, split...)
  static constexpr uint64_t kMaxSteps = 2'000'000;    // evaluation steps (expressions + loop iterations) per render
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    Literal,   // value
    Name,      // name
    List,      // kids
    Tuple,     // kids (a tuple is a list when printed except for its brackets)
    Dict,      // kids: key, value, key, value...
    Attr,      // kids[0].name
    Item,      // kids[0][kids[1]]
    Slice,     // kids[0][kids[1]:kids[2]:kids[3]] (null kids where omitted)
    Call,      // kids[0](kids[1..]) with kwarg_names for the trailing kwargs
    Filter,    // kids[0] | name(kids[1..]) (kwarg_names as for Call)
    Test,      // kids[0] is [not] name(kids[1..])
    Neg,       // -kids[0]
    Pos,       // +kids[0]
    Not,       // not kids[0]
    And,
    Or,
    Binary,    // kids[0] op kids[1]: + - * / // % ** ~ == != < <= > >= in notin
    Cond,      // kids[1] if kids[0] else kids[2] (kids[2] null: Undefined)
  };
  K k;
  Pos pos;
  std::string name;  // Name / Attr / Filter / Test name, Binary operator
  Value value;       // Literal
  bool negated = false;
  int height = 1;
  std::vector<ExprP> kids;
  std::vector<std::string> kwarg_names;  // Call / Filter: names of the last kwarg_names.size() arguments
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class K { Text, Output, If, For, Set, SetBlock, Break, Continue, Scope };
  K k;
  Pos pos;
  std::string text;                       // Text
  ExprP expr;                             // Output; Set value; For iterable
  // If: conditions[i] guards bodies[i]; a trailing else is bodies.back() when bodies.size() > conditions.size().
  std::vector<ExprP> conditions;
  std::vector<Body> bodies;               // For: bodies[0] loop body, bodies[1] else (optional); SetBlock / Scope: bodies[0]
  std::vector<std::string> targets;       // For: loop variable(s); Set / SetBlock: names (several for tuple unpacking)
  std::string attr;                       // Set: `set ns.attr = ...` assigns ns's attribute attr (targets[0] = ns)
  ExprP filter;                           // For: the `if` filter of `for x in xs if cond`
};

struct Program {
  Body body;
};

// Parses `source`; TemplateError naming the construct and line:column for syntax errors and
// anything outside the subset.
Program parse(const std::string& source);

// Renders; TemplateError for failures (raise_exception, type errors, limits).
std::string render(const Program& program, const nlohmann::json& context);
std::string render(const Program& program, const nlohmann::ordered_json& context);

// "chat template line L:C: " -- the prefix every TemplateError message starts with.
std::string where(Pos p);

}  // namespace corelm::infer::jinja
