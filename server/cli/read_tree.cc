#include "server/cli/read_tree.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace packsched::cli {
namespace {

class Reader {
 public:
  Reader(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": byte ", pos_, ": ", what, " (a tree is {\"node_len\": [...], ",
                     "\"node_parent\": [...], \"rollout_leaf\": [...]})"));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }
  // A member name: a plain JSON string (no escapes are needed for the names it accepts).
  absl::StatusOr<std::string> Name() {
    if (!Eat('"')) return Error("expected a member name");
    const size_t end = text_.find('"', pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string name(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return name;
  }
  absl::StatusOr<std::vector<int64_t>> Ints() {
    if (!Eat('[')) return Error("expected an array of integers");
    std::vector<int64_t> out;
    if (Eat(']')) return out;
    do {
      SkipSpace();
      int64_t v = 0;
      const char* begin = text_.data() + pos_;
      const auto [ptr, ec] = std::from_chars(begin, text_.data() + text_.size(), v);
      if (ec != std::errc() || ptr == begin) return Error("expected an integer");
      if (ptr < text_.data() + text_.size() && (*ptr == '.' || *ptr == 'e' || *ptr == 'E')) {
        return Error("expected an integer, not a fraction");
      }
      pos_ = ptr - text_.data();
      out.push_back(v);
    } while (Eat(','));
    if (!Eat(']')) return Error("expected ',' or ']'");
    return out;
  }

 private:
  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<planner::Forest> ParseForest(absl::string_view text, absl::string_view source) {
  Reader r(text, source);
  planner::Forest forest;
  bool seen[4] = {false, false, false, false};
  if (!r.Eat('{')) return r.Error("expected '{'");
  if (!r.Eat('}')) {
    do {
      absl::StatusOr<std::string> name = r.Name();
      if (!name.ok()) return name.status();
      if (!r.Eat(':')) return r.Error("expected ':'");
      static constexpr absl::string_view kNames[4] = {"node_len", "node_parent", "rollout_leaf",
                                                      "rollout_len"};
      std::vector<int64_t>* fields[4] = {&forest.node_len, &forest.node_parent,
                                         &forest.rollout_leaf, &forest.rollout_len};
      int which = -1;
      for (int i = 0; i < 4; ++i) {
        if (*name == kNames[i]) which = i;
      }
      if (which < 0) return r.Error(absl::StrCat("unknown member \"", *name, "\""));
      if (seen[which]) return r.Error(absl::StrCat("member \"", *name, "\" given twice"));
      seen[which] = true;
      absl::StatusOr<std::vector<int64_t>> values = r.Ints();
      if (!values.ok()) return values.status();
      *fields[which] = *std::move(values);
    } while (r.Eat(','));
    if (!r.Eat('}')) return r.Error("expected ',' or '}'");
  }
  if (!r.AtEnd()) return r.Error("content after the object");
  if (!seen[0] || !seen[1] || !seen[2]) {
    return r.Error("node_len, node_parent and rollout_leaf are required");
  }
  return forest;
}

}  // namespace packsched::cli
