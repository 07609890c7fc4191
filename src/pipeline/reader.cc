#include "pipeline/reader.h"

#include <cstdio>

#include "corelm/error.h"
#include "corelm/utf8.h"

namespace corelm::pipeline {

ChunkWork ChunkReader::read(const Chunk& chunk) {
  // Chunks of one file come in order, so the reader usually just continues where it stopped.
  if (open_file_ != chunk.file || !reader_ || reader_->line_number() >= chunk.first_line) {
    reader_ = std::make_unique<LineReader>(plan_.files[chunk.file], max_line_bytes_);
    open_file_ = chunk.file;
  }
  reader_->skip_to(chunk.first_line, chunk.offset);
  ChunkWork work;
  work.chunk = chunk;
  std::string line;
  bool too_long = false;
  const std::string& file = plan_.files[chunk.file];
  for (int64_t i = 0; i < chunk.lines; ++i) {
    CORELM_CHECK(reader_->next(line, too_long), IOError, file, ": ended before line ", chunk.first_line + i,
                 " (did the file change during the run?)");
    if (!too_long && line.find_first_not_of(" \t") == std::string::npos) continue;  // blank: not a record
    work.items.push_back(parse_line(file, reader_->line_number(), line, too_long));
  }
  return work;
}

Item ChunkReader::parse_line(const std::string& file, int64_t line_no, const std::string& line, bool too_long) const {
  Item item;
  item.line = line_no;
  item.id = escape_invalid_utf8(file) + ":" + std::to_string(line_no);  // JSON output: valid UTF-8
  if (too_long) {
    item.error = "line longer than --max-line-bytes " + std::to_string(max_line_bytes_);
    return item;
  }
  // JSON text is UTF-8; name the first bad byte rather than quote it in a parser message.
  if (const size_t bad = first_invalid_utf8(line); bad != std::string::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(line[bad]));
    item.error = "invalid UTF-8 (byte " + std::string(hex) + " at byte " + std::to_string(bad) +
                 " of the line); JSON lines must be UTF-8";
    return item;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    item.error = std::string("invalid JSON: ") + e.what();
    return item;
  }
  if (!j.is_object()) {
    item.error = "expected a JSON object, got " + std::string(j.type_name());
    return item;
  }
  auto field = [&](const std::string& name) -> const nlohmann::json* {
    if (name.starts_with("/")) {
      try {
        const nlohmann::json::json_pointer ptr(name);
        return j.contains(ptr) ? &j.at(ptr) : nullptr;
      } catch (const nlohmann::json::exception&) {
        return nullptr;
      }
    }
    auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
  };
  if (!spec_.id_field.empty()) {
    const nlohmann::json* id = field(spec_.id_field);
    if (!id || !(id->is_string() || id->is_number_integer())) {
      item.error = id ? "id field '" + spec_.id_field + "' is not a string or an integer"
                      : "missing id field '" + spec_.id_field + "'";
      return item;
    }
    item.id = *id;
  }
  const nlohmann::json* text = field(spec_.text_field);
  if (!text) {
    item.error = "missing text field '" + spec_.text_field + "'";
    return item;
  }
  if (!text->is_string()) {
    item.error = "text field '" + spec_.text_field + "' is a " + text->type_name() + ", not a string";
    return item;
  }
  try {
    item.doc = engine_.prepare(text->get_ref<const std::string&>(), item.error);
  } catch (const Error& e) {
    item.error = e.what();
  }
  return item;
}

}  // namespace corelm::pipeline
