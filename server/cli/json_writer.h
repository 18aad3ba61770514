#ifndef PACKSCHED_SERVER_CLI_JSON_WRITER_H_
#define PACKSCHED_SERVER_CLI_JSON_WRITER_H_

// A minimal streaming JSON writer (RFC 8259) for the CLI's output: no dependency, no DOM.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace packsched::cli {

// `s` as a JSON string literal, quotes included. '"', '\\' and control characters are escaped;
// other bytes pass through unchanged (REQUIRES: `s` is UTF-8 for the result to be valid JSON).
std::string JsonString(absl::string_view s);

// `v` as a JSON number that parses back to exactly `v` (the shortest such form), or `null` for
// NaN and infinities, which JSON cannot represent.
std::string JsonNumber(double v);

// Appends values to a string, inserting the commas and colons. Values written at the top
// level or after Key() in an object, or as array elements. REQUIRES: calls are well nested
// (Key() only directly inside an object, every Begin matched by its End); the writer does
// not check. Not thread-safe.
//
//   JsonWriter w;
//   w.BeginObject();
//   w.Key("k");
//   w.Int(3);
//   w.EndObject();  // w.str() == R"({"k":3})"
class JsonWriter {
 public:
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void Key(absl::string_view key);

  void Int(int64_t v);
  void Double(double v);
  void Bool(bool v);
  void String(absl::string_view v);
  void Null();
  // An array of integers.
  void IntArray(absl::Span<const int64_t> values);
  void IntArray(absl::Span<const int32_t> values);

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Open(char bracket);
  void Close(char bracket);
  // Writes the comma that separates this value from the previous element, if any.
  void BeforeValue();

  std::string out_;
  std::vector<bool> has_element_;  // one per open object/array
  bool after_key_ = false;
};

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_JSON_WRITER_H_
