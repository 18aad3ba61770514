#include "server/cli/read_tree.h"

#include <charconv>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/planner/schema.h"

namespace packsched::cli {
namespace {

class Reader {
 public:
  Reader(absl::string_view text, absl::string_view source) : text_(text), source_(source) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": byte ", pos_, ": ", what, " (a tree is ", ForestShape(), ")"));
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

// A forest's members (PACKSCHED_FOREST): the row
//   X(node_len, 1, Nodes)
// expands, through PACKSCHED_TREE_MEMBER, to
//   Member{"node_len", &forest.node_len, true},
// (through PACKSCHED_REQUIRED_NAME, to "node_len", for a required one: Nodes and Rollouts).
struct Member {
  absl::string_view name;
  std::vector<int64_t>* values;
  bool required;
};
#define PACKSCHED_TREE_REQUIRED_Nodes true
#define PACKSCHED_TREE_REQUIRED_Rollouts true
#define PACKSCHED_TREE_REQUIRED_Checked false
#define PACKSCHED_TREE_MEMBER(name, number, Kind) \
  Member{#name, &forest.name, PACKSCHED_TREE_REQUIRED_##Kind},
#define PACKSCHED_REQUIRED_NAME_Nodes(name) #name,
#define PACKSCHED_REQUIRED_NAME_Rollouts(name) #name,
#define PACKSCHED_REQUIRED_NAME(name, number, Kind) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_REQUIRED_NAME, Kind, Checked)(name)

constexpr absl::string_view kRequired[] = {PACKSCHED_FOREST(PACKSCHED_REQUIRED_NAME)};

}  // namespace

std::string ForestShape() {
  return absl::StrCat("{",
                      absl::StrJoin(kRequired, ", ",
                                    [](std::string* out, absl::string_view name) {
                                      absl::StrAppend(out, "\"", name, "\": [...]");
                                    }),
                      "}");
}

absl::StatusOr<planner::Forest> ParseForest(absl::string_view text, absl::string_view source) {
  Reader r(text, source);
  planner::Forest forest;
  Member members[] = {PACKSCHED_FOREST(PACKSCHED_TREE_MEMBER)};
  bool seen[std::size(members)] = {};
  if (!r.Eat('{')) return r.Error("expected '{'");
  if (!r.Eat('}')) {
    do {
      absl::StatusOr<std::string> name = r.Name();
      if (!name.ok()) return name.status();
      if (!r.Eat(':')) return r.Error("expected ':'");
      int which = -1;
      for (size_t i = 0; i < std::size(members); ++i) {
        if (*name == members[i].name) which = static_cast<int>(i);
      }
      if (which < 0) return r.Error(absl::StrCat("unknown member \"", *name, "\""));
      if (seen[which]) return r.Error(absl::StrCat("member \"", *name, "\" given twice"));
      seen[which] = true;
      absl::StatusOr<std::vector<int64_t>> values = r.Ints();
      if (!values.ok()) return values.status();
      *members[which].values = *std::move(values);
    } while (r.Eat(','));
    if (!r.Eat('}')) return r.Error("expected ',' or '}'");
  }
  if (!r.AtEnd()) return r.Error("content after the object");
  for (size_t i = 0; i < std::size(members); ++i) {
    if (members[i].required && !seen[i]) {
      const absl::Span<const absl::string_view> all(kRequired);
      return r.Error(absl::StrCat(absl::StrJoin(all.first(all.size() - 1), ", "), " and ",
                                  all.back(), " are required"));
    }
  }
  return forest;
}

}  // namespace packsched::cli
