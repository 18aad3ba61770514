#ifndef PACKSCHED_SERVER_CLI_PLAN_FLAGS_H_
#define PACKSCHED_SERVER_CLI_PLAN_FLAGS_H_

// The flags of `packsched plan` (absl flags) and their translation into a PlanRequest.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "server/cli/plan_command.h"
#include "server/cli/read_jsonl.h"

namespace packsched::cli {

enum class OutputFormat { kTable, kJson };

// The request the parsed flags describe. Returns InvalidArgument naming the flag and value for
// an unknown name (--algorithm, --cap_mode, --cost, --overlong, --order, --sync), a malformed
// --attention_cost or one whose weights are outside [0, 2^32], --attention_cost without
// --cost=attention, or a --model_config that cannot be read or parsed. The options' other
// ranges are checked by CheckRequest. REQUIRES: absl::ParseCommandLine has run.
absl::StatusOr<PlanRequest> RequestFromFlags();

// --format; InvalidArgument for anything but "table" or "json".
absl::StatusOr<OutputFormat> FormatFromFlags();

// --lengths: a file path, or empty for stdin.
std::string LengthsPathFromFlags();

// --tree: the file of a forest of rollouts (read_tree.h), or empty for a plan of lengths.
std::string TreePathFromFlags();

// --length_field or --token_field (JSON Lines input), or nullopt for neither. InvalidArgument
// when both are set.
absl::StatusOr<std::optional<JsonlField>> JsonlFieldFromFlags();

// --progress: whether a long run reports on stderr.
bool ProgressFromFlags();

// The files the flags name, before any is read: --lengths and --tree (unless empty or "-" for
// stdin) exist and can be read (a regular file, a pipe or a character device: not a directory),
// --model_config is a readable regular file. InvalidArgument "--flag=path: <why>".
absl::Status CheckInputFlags();

// The usage text: synopsis, examples and every flag of `packsched plan` with its default.
std::string HelpText();

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_PLAN_FLAGS_H_
