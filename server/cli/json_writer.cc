#include "server/cli/json_writer.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace packsched::cli {

namespace {

// Appends `s` as a JSON string literal to `out` (no temporary: keys are written per value).
void AppendJsonString(absl::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace

std::string JsonString(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  AppendJsonString(s, out);
  return out;
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  // to_chars without a precision gives the shortest text that reads back as exactly v; its
  // forms ("1e+20", "-0", "0.1") are all valid JSON numbers.
  char buffer[32];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, result.ptr);
}

void JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  AppendJsonString(key, out_);
  out_ += ':';
  after_key_ = true;
}

void JsonWriter::Int(int64_t v) {
  BeforeValue();
  absl::StrAppend(&out_, v);
}

void JsonWriter::Double(double v) {
  BeforeValue();
  out_ += JsonNumber(v);
}

void JsonWriter::Bool(bool v) {
  BeforeValue();
  out_ += v ? "true" : "false";
}

void JsonWriter::String(absl::string_view v) {
  BeforeValue();
  AppendJsonString(v, out_);
}

void JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
}

void JsonWriter::IntArray(absl::Span<const int64_t> values) {
  BeginArray();
  for (int64_t v : values) Int(v);
  EndArray();
}

void JsonWriter::IntArray(absl::Span<const int32_t> values) {
  BeginArray();
  for (int32_t v : values) Int(v);
  EndArray();
}

void JsonWriter::Open(char bracket) {
  BeforeValue();
  out_ += bracket;
  has_element_.push_back(false);
}

void JsonWriter::Close(char bracket) {
  out_ += bracket;
  has_element_.pop_back();
}

void JsonWriter::BeforeValue() {
  if (after_key_) {  // the value of a key: the key already took the separator
    after_key_ = false;
    return;
  }
  if (!has_element_.empty()) {
    if (has_element_.back()) out_ += ',';
    has_element_.back() = true;
  }
}

}  // namespace packsched::cli
