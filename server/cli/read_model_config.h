#ifndef PACKSCHED_SERVER_CLI_READ_MODEL_CONFIG_H_
#define PACKSCHED_SERVER_CLI_READ_MODEL_CONFIG_H_

// `packsched plan --model_config=FILE`: the top-level fields of a Hugging Face style
// config.json, as the planner's model cost reads them (server/planner/model_cost.h).

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace packsched::cli {

struct ModelFields {
  absl::flat_hash_map<std::string, int64_t> ints;         // integer members (not 1.0, not true)
  absl::flat_hash_map<std::string, std::string> strings;  // string members, unescaped
};

// Parses `text` (RFC 8259 JSON whose top level is an object) and keeps its top-level integers
// and strings; nested values are checked and skipped. InvalidArgument naming `source` and the
// byte offset for malformed JSON, a top level that is not an object, or nesting deeper than 64.
absl::StatusOr<ModelFields> ParseModelConfig(absl::string_view text, absl::string_view source);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_READ_MODEL_CONFIG_H_
