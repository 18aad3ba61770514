#ifndef PACKSCHED_SERVER_CLI_READ_JSONL_H_
#define PACKSCHED_SERVER_CLI_READ_JSONL_H_

// Sequence lengths from JSON Lines (one JSON object per line, e.g. a tokenised dataset), as
// `packsched plan --length_field=NAME` and `--token_field=NAME` read them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packsched::cli {

// Which field of each record gives its length.
struct JsonlField {
  enum class Kind {
    kLength,  // an integer: the length itself
    kTokens,  // an array (of token ids): its number of elements
  };
  Kind kind = Kind::kLength;
  std::string name;
};

// Parses `text`, one JSON object per line (blank lines are skipped), into one length per
// record: the value of the top-level field `field.name`, or the number of elements of that
// array. Other fields, however large or nested, are read past without being stored. Every
// length must be an integer in [1, planner::kMaxLength]. `source` names the input in messages.
//
// Returns InvalidArgument naming the source and the line for: a line that is not valid JSON
// (with the parser's column and reason), a record that is not an object, a record without the
// field or with it twice, a field of the wrong type (naming the type found), a length out of
// range, or no records at all.
absl::StatusOr<std::vector<int64_t>> ParseJsonlLengths(absl::string_view text,
                                                       absl::string_view source,
                                                       const JsonlField& field);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_READ_JSONL_H_
