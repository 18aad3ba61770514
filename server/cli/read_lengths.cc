#include "server/cli/read_lengths.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/planner/options.h"

namespace packsched::cli {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// Shown in messages: long or binary tokens are cut so an error stays one readable line.
std::string Shown(absl::string_view token) {
  std::string out;
  for (char c : token.substr(0, 40)) {
    const unsigned char u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (token.size() > 40) out += "...";
  return out;
}

// One length from `token`; `where` prefixes the error ("lengths.txt:3").
absl::StatusOr<int64_t> ParseLength(absl::string_view token, absl::string_view where) {
  int64_t value = 0;
  const char* end = token.data() + token.size();
  const auto [ptr, ec] = std::from_chars(token.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": length '", Shown(token), "' is out of range [1, ", planner::kMaxLength, "]"));
  }
  if (ec != std::errc() || ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", Shown(token), "' is not an integer length"));
  }
  if (value < 1 || value > planner::kMaxLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": length ", value, " is out of range [1, ", planner::kMaxLength, "]"));
  }
  return value;
}

absl::StatusOr<std::vector<int64_t>> ParseLines(absl::string_view text, absl::string_view source) {
  std::vector<int64_t> lengths;
  int64_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t newline = text.find('\n');
    absl::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == absl::string_view::npos ? text.size() : newline + 1);
    while (!line.empty() && IsBlank(line.front())) line.remove_prefix(1);
    while (!line.empty() && IsBlank(line.back())) line.remove_suffix(1);
    if (line.empty()) continue;
    absl::StatusOr<int64_t> length = ParseLength(line, absl::StrCat(source, ":", line_number));
    if (!length.ok()) return length.status();
    lengths.push_back(*length);
  }
  return lengths;
}

// A cursor over JSON text that knows its line and column (both 1-based).
class JsonCursor {
 public:
  explicit JsonCursor(absl::string_view text) : text_(text) {}

  void SkipBlanks() {
    while (pos_ < text_.size() && IsBlank(text_[pos_])) Advance();
  }
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  void Advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
    ++pos_;
  }
  // The token at the cursor: everything up to a blank, ',', ']' or the end.
  absl::string_view TakeToken() {
    const size_t start = pos_;
    while (pos_ < text_.size() && !IsBlank(text_[pos_]) && text_[pos_] != ',' &&
           text_[pos_] != ']') {
      Advance();
    }
    return text_.substr(start, pos_ - start);
  }
  // The rest of the current line.
  absl::string_view RestOfLine() const {
    const absl::string_view rest = text_.substr(pos_);
    return rest.substr(0, rest.find('\n'));
  }
  std::string Where(absl::string_view source) const {
    return absl::StrCat(source, ":", line_, ":", column_);
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
  int64_t line_ = 1;
  int64_t column_ = 1;
};

absl::StatusOr<std::vector<int64_t>> ParseJsonArray(absl::string_view text,
                                                    absl::string_view source) {
  std::vector<int64_t> lengths;
  JsonCursor cursor(text);
  cursor.SkipBlanks();
  cursor.Advance();  // the '[' the caller saw
  cursor.SkipBlanks();
  if (!cursor.AtEnd() && cursor.Peek() == ']') {
    cursor.Advance();
  } else {
    while (true) {
      if (cursor.AtEnd()) {
        return absl::InvalidArgumentError(
            absl::StrCat(cursor.Where(source), ": the JSON array ends before its ']'"));
      }
      const std::string where = cursor.Where(source);
      const absl::string_view token = cursor.TakeToken();
      if (token.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": expected a length at index ",
                                                       lengths.size(), " of the JSON array, got '",
                                                       Shown(std::string(1, cursor.Peek())), "'"));
      }
      absl::StatusOr<int64_t> length =
          ParseLength(token, absl::StrCat(where, ": index ", lengths.size()));
      if (!length.ok()) return length.status();
      lengths.push_back(*length);
      cursor.SkipBlanks();
      if (cursor.AtEnd()) {
        return absl::InvalidArgumentError(
            absl::StrCat(cursor.Where(source), ": the JSON array ends before its ']'"));
      }
      if (cursor.Peek() == ']') {
        cursor.Advance();
        break;
      }
      if (cursor.Peek() != ',') {
        const std::string after = cursor.Where(source);
        return absl::InvalidArgumentError(absl::StrCat(after, ": expected ',' or ']' after index ",
                                                       lengths.size() - 1, ", got '",
                                                       Shown(cursor.TakeToken()), "'"));
      }
      cursor.Advance();
      cursor.SkipBlanks();
    }
  }
  cursor.SkipBlanks();
  if (!cursor.AtEnd()) {
    const std::string where = cursor.Where(source);
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": unexpected '", Shown(cursor.RestOfLine()), "' after the JSON array"));
  }
  return lengths;
}

// strerror's text for `error`; thread-safe, unlike strerror.
std::string ErrnoText(int error) { return std::generic_category().message(error); }

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view text,
                                                  absl::string_view source) {
  size_t first = 0;
  while (first < text.size() && IsBlank(text[first])) ++first;
  if (first < text.size() && text[first] == '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": JSON Lines input: name the field that gives each length with "
                     "--length_field=NAME (an integer) or --token_field=NAME (an array)"));
  }
  absl::StatusOr<std::vector<int64_t>> lengths = first < text.size() && text[first] == '['
                                                     ? ParseJsonArray(text, source)
                                                     : ParseLines(text, source);
  if (lengths.ok() && lengths->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no lengths in the input"));
  }
  return lengths;
}

absl::StatusOr<std::string> ReadInput(absl::string_view path) {
  const bool from_stdin = path.empty() || path == "-";
  if (from_stdin && isatty(STDIN_FILENO)) {
    return absl::InvalidArgumentError(
        "no --lengths=FILE given and stdin is a terminal; pipe the lengths in or name a file");
  }
  std::unique_ptr<FILE, int (*)(FILE*)> owned(nullptr, fclose);
  FILE* file = stdin;
  if (!from_stdin) {
    owned.reset(fopen(std::string(path).c_str(), "rb"));
    if (owned == nullptr) {
      const int error = errno;
      const std::string message = absl::StrCat("cannot open ", path, ": ", ErrnoText(error));
      if (error == ENOENT) return absl::NotFoundError(message);
      if (error == EACCES) return absl::PermissionDeniedError(message);
      return absl::UnavailableError(message);
    }
    file = owned.get();
  }
  std::string content;
  char buffer[1 << 16];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), file)) > 0) content.append(buffer, got);
  if (ferror(file)) {
    return absl::UnavailableError(
        absl::StrCat("cannot read ", from_stdin ? "stdin" : path, ": ", ErrnoText(errno)));
  }
  return content;
}

}  // namespace packsched::cli
