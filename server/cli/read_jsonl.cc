#include "server/cli/read_jsonl.h"

#include <cstddef>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/planner/options.h"

namespace packsched::cli {
namespace {

using Json = nlohmann::json;

// nlohmann's SAX events for one record: follows the nesting, and of the top-level field named
// `field` keeps the integer value (kLength) or counts the array's elements (kTokens). Nothing
// else is stored, so a record's token arrays cost no memory. Returns false (stop) on the first
// problem, leaving it in error(); parse errors arrive as a call, never as a thrown exception.
class RecordHandler {
 public:
  explicit RecordHandler(const JsonlField& field) : field_(field) {}

  bool null() { return Scalar("null"); }
  bool boolean(bool /*value*/) { return Scalar("a boolean"); }
  bool number_integer(Json::number_integer_t v) { return Integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) {
    return Integer(v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                       ? std::numeric_limits<int64_t>::max()
                       : static_cast<int64_t>(v));
  }
  bool number_float(Json::number_float_t /*value*/, const Json::string_t& text) {
    return Scalar(absl::StrCat("the number ", text));
  }
  bool string(Json::string_t& /*value*/) { return Scalar("a string"); }
  bool binary(Json::binary_t& /*value*/) { return Scalar("binary data"); }
  bool start_object(std::size_t /*elements*/) { return Open(/*array=*/false); }
  bool end_object() { return Close(); }
  bool start_array(std::size_t /*elements*/) { return Open(/*array=*/true); }
  bool end_array() { return Close(); }
  bool key(Json::string_t& key) {
    at_field_ = depth_ == 1 && key == field_.name;
    if (at_field_ && seen_) return Fail(absl::StrCat("field '", field_.name, "' appears twice"));
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    absl::string_view what = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 7: ..." -> from "column".
    const size_t column = what.find("column ");
    if (column != absl::string_view::npos) what.remove_prefix(column);
    return Fail(absl::StrCat("not valid JSON: ", what));
  }

  // The length of a record parsed to its end without error.
  absl::StatusOr<int64_t> Length() const {
    if (!seen_) return absl::InvalidArgumentError(absl::StrCat("no field '", field_.name, "'"));
    if (length_ < 1 || length_ > planner::kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat("field '", field_.name, "': length ", length_,
                                                     " is out of range [1, ", planner::kMaxLength,
                                                     "]"));
    }
    return length_;
  }
  const std::string& error() const { return error_; }

 private:
  // A value starts: the top-level record itself, an element of the counted array, or the
  // field's own value.
  bool Value(absl::string_view type, std::optional<int64_t> integer, bool array) {
    if (depth_ == 0 && !array_or_object_started_) {
      return Fail(absl::StrCat("the record is ", type, ", not a JSON object"));
    }
    if (counting_ && depth_ == 2) ++length_;
    if (depth_ != 1 || !at_field_) return true;
    at_field_ = false;
    seen_ = true;
    if (field_.kind == JsonlField::Kind::kLength) {
      if (integer) {
        length_ = *integer;
        return true;
      }
      return Fail(absl::StrCat("field '", field_.name, "' is ", type, ", not an integer length"));
    }
    if (array) {
      counting_ = true;
      return true;
    }
    return Fail(absl::StrCat("field '", field_.name, "' is ", type, ", not an array of tokens"));
  }
  bool Scalar(absl::string_view type) { return Value(type, std::nullopt, false); }
  bool Integer(int64_t v) { return Value(absl::StrCat("the integer ", v), v, false); }
  bool Open(bool array) {
    if (depth_ == 0) {
      if (array) return Fail("the record is an array, not a JSON object");
      array_or_object_started_ = true;
    } else if (!Value(array ? "an array" : "an object", std::nullopt, array)) {
      return false;
    }
    ++depth_;
    return true;
  }
  bool Close() {
    --depth_;
    if (depth_ == 1) counting_ = false;
    return true;
  }
  bool Fail(std::string message) {
    error_ = std::move(message);
    return false;
  }

  const JsonlField& field_;
  int depth_ = 0;
  bool array_or_object_started_ = false;
  bool at_field_ = false;  // the next value at depth 1 is the field's
  bool seen_ = false;
  bool counting_ = false;  // inside the field's array (kTokens)
  int64_t length_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseJsonlLengths(absl::string_view text,
                                                       absl::string_view source,
                                                       const JsonlField& field) {
  std::vector<int64_t> lengths;
  int64_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t newline = text.find('\n');
    absl::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == absl::string_view::npos ? text.size() : newline + 1);
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    RecordHandler record(field);
    const bool parsed = Json::sax_parse(line.begin(), line.end(), &record);
    absl::StatusOr<int64_t> length =
        parsed ? record.Length() : absl::InvalidArgumentError(record.error());
    if (!length.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", line_number, ": ", length.status().message()));
    }
    lengths.push_back(*length);
  }
  if (lengths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no records in the input"));
  }
  return lengths;
}

}  // namespace packsched::cli
