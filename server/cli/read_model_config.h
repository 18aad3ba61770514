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
  // Integer members, whole numbers written as reals included (4096.0; not true).
  absl::flat_hash_map<std::string, int64_t> ints;
  // String members, unescaped; and the JSON text of the other numbers (0.5, 1e30), of arrays and
  // of true, false and null (the model cost refuses a non-integer where it reads an integer;
  // mlp_only_layers and layer_types are lists, use_sliding_window a bool, null a missing size).
  absl::flat_hash_map<std::string, std::string> strings;
};

// Parses `text` (RFC 8259 JSON whose top level is an object) and keeps its top-level members as
// ModelFields says, with those of a `text_config` object (a vision-language model's language
// model) in place of the top level's of the same names; other nested values are checked and
// skipped. InvalidArgument naming `source` and the byte offset for malformed JSON, a top level
// that is not an object, or nesting deeper than 64.
absl::StatusOr<ModelFields> ParseModelConfig(absl::string_view text, absl::string_view source);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_READ_MODEL_CONFIG_H_
