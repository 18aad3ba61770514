#ifndef PACKSCHED_SERVER_CLI_READ_LENGTHS_H_
#define PACKSCHED_SERVER_CLI_READ_LENGTHS_H_

// Sequence lengths as `packsched plan` reads them: from a file or stdin, as one integer per
// line or as one JSON array of integers.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packsched::cli {

// Parses `text` into lengths. The format is chosen by the first non-blank character: `[` means
// one JSON array of integers (whitespace and newlines anywhere between tokens); anything else
// means one integer per line (blank lines are skipped; spaces, tabs and a trailing '\r' around
// a number are allowed). Every length must be an integer in [1, planner::kMaxLength]. Text that
// starts with `{` (JSON Lines) is refused with a message naming --length_field and
// --token_field (read_jsonl.h reads it).
// `source` names the input in error messages ("lengths.txt", "stdin").
//
// Returns InvalidArgument naming the source, the line (and, for JSON, the column and the
// element's 0-based index) and the offending text for: a token that is not an integer, a length out
// of range, malformed JSON (missing comma or bracket, trailing content), or no lengths at all.
absl::StatusOr<std::vector<int64_t>> ParseLengths(absl::string_view text, absl::string_view source);

// The whole content of `path`, or of stdin when `path` is empty or "-". Returns NotFound or
// PermissionDenied (with the system's reason) if the file cannot be opened, Unavailable if a
// read fails, and InvalidArgument if stdin is a terminal (nothing was piped in).
absl::StatusOr<std::string> ReadInput(absl::string_view path);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_READ_LENGTHS_H_
