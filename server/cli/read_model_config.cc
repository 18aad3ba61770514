#include "server/cli/read_model_config.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace packsched::cli {
namespace {

constexpr int kMaxDepth = 64;

// A JSON number's value when it is a whole number in int64 (4096, 4096.0, 4.096e3).
std::optional<int64_t> WholeNumber(absl::string_view number) {
  int64_t value = 0;
  if (absl::SimpleAtoi(number, &value)) return value;
  double real = 0;
  if (!absl::SimpleAtod(number, &real) || !std::isfinite(real) || real != std::floor(real) ||
      real < -0x1p63 || real >= 0x1p63) {
    return std::nullopt;
  }
  return static_cast<int64_t>(real);
}

// A recursive-descent reader over `text`; every method returns false on malformed input with
// `pos` at the offending byte.
class Reader {
 public:
  explicit Reader(absl::string_view text) : text_(text) {}

  size_t pos() const { return pos_; }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

  // An object's members into `out`: integers (whole numbers written with a fraction or an
  // exponent too) and strings; other numbers, arrays, true, false and null as their JSON text
  // among the strings (the model cost refuses a non-integer where it reads an integer, and reads
  // mlp_only_layers and layer_types as lists, use_sliding_window as a bool); objects checked and
  // dropped. With `nested`, a text_config object member is
  // read the same way into it.
  bool Object(ModelFields& out, ModelFields* nested) {
    SkipSpace();
    if (!Eat('{')) return false;
    SkipSpace();
    if (Eat('}')) return true;
    while (true) {
      SkipSpace();
      std::string key;
      if (!String(&key)) return false;
      SkipSpace();
      if (!Eat(':')) return false;
      SkipSpace();
      if (Peek() == '"') {
        std::string value;
        if (!String(&value)) return false;
        out.strings[key] = std::move(value);
      } else if (Peek() == '-' || std::isdigit(static_cast<unsigned char>(Peek()))) {
        absl::string_view number;
        if (!Number(&number)) return false;
        if (std::optional<int64_t> value = WholeNumber(number)) {
          out.ints[key] = *value;
        } else {
          out.strings[key] = std::string(number);
        }
      } else if (Peek() == '[') {
        const size_t start = pos_;
        if (!Value(1)) return false;
        out.strings[key] = std::string(text_.substr(start, pos_ - start));
      } else if (Peek() == 't' || Peek() == 'f' || Peek() == 'n') {
        const size_t start = pos_;
        if (!Value(1)) return false;
        out.strings[key] = std::string(text_.substr(start, pos_ - start));
      } else if (Peek() == '{' && nested != nullptr && key == "text_config") {
        if (!Object(*nested, nullptr)) return false;
      } else if (!Value(1)) {
        return false;
      }
      SkipSpace();
      if (Eat('}')) return true;
      if (!Eat(',')) return false;
    }
  }

 private:
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Literal(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool Number(absl::string_view* out) {
    const size_t start = pos_;
    Eat('-');
    if (!std::isdigit(static_cast<unsigned char>(Peek()))) return false;
    if (!Eat('0')) {
      while (std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    }
    if (Eat('.')) {
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) return false;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) return false;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) ++pos_;
    }
    *out = text_.substr(start, pos_ - start);
    return true;
  }
  // A string; \uXXXX escapes outside ASCII are kept as '?' (no field the cost reads needs them).
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      const char e = Peek();
      ++pos_;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          int code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = Peek();
            if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
            code = code * 16 +
                   (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
            ++pos_;
          }
          out->push_back(code < 0x80 ? static_cast<char>(code) : '?');
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  // Any value, checked and dropped.
  bool Value(int depth) {
    if (depth > kMaxDepth) return false;
    SkipSpace();
    switch (Peek()) {
      case '"': {
        std::string ignored;
        return String(&ignored);
      }
      case '{':
      case '[': {
        const char close = Peek() == '{' ? '}' : ']';
        const bool object = close == '}';
        ++pos_;
        SkipSpace();
        if (Eat(close)) return true;
        while (true) {
          SkipSpace();
          if (object) {
            std::string key;
            if (!String(&key)) return false;
            SkipSpace();
            if (!Eat(':')) return false;
          }
          if (!Value(depth + 1)) return false;
          SkipSpace();
          if (Eat(close)) return true;
          if (!Eat(',')) return false;
        }
      }
      case 't':
        return Literal("true");
      case 'f':
        return Literal("false");
      case 'n':
        return Literal("null");
      default: {
        absl::string_view ignored;
        return Number(&ignored);
      }
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<ModelFields> ParseModelConfig(absl::string_view text, absl::string_view source) {
  ModelFields fields, language;
  Reader reader(text);
  if (!reader.Object(fields, &language) || !reader.AtEnd()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not a JSON object (a Hugging Face config.json) at byte ", reader.pos()));
  }
  // A vision-language model's text_config describes its language model: its fields win.
  for (auto& [key, value] : language.ints) {
    fields.strings.erase(key);
    fields.ints[key] = value;
  }
  for (auto& [key, value] : language.strings) {
    fields.ints.erase(key);
    fields.strings[key] = std::move(value);
  }
  return fields;
}

}  // namespace packsched::cli
