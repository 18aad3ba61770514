#ifndef PACKSCHED_SERVER_CLI_READ_TREE_H_
#define PACKSCHED_SERVER_CLI_READ_TREE_H_

// `packsched plan --tree=FILE`: a forest of rollouts as JSON (client/README.md, "Tree input"):
//   {"node_len": [...], "node_parent": [...], "rollout_leaf": [...], "rollout_len": [...]}
// one object whose members are arrays of integers; rollout_len is optional. The planner
// validates the forest itself (planner::IndexForest).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/planner/forest.h"

namespace packsched::cli {

// InvalidArgument naming `source` and the byte offset for malformed JSON, a member that is
// not an array of integers (or an integer out of int64), an unknown or repeated member, or a
// missing node_len, node_parent or rollout_leaf.
absl::StatusOr<planner::Forest> ParseForest(absl::string_view text, absl::string_view source);

// The object's required members as the flag's help and the errors show them (the Nodes and
// Rollouts rows of PACKSCHED_FOREST, server/planner/schema.h):
//   {"node_len": [...], "node_parent": [...], "rollout_leaf": [...]}
std::string ForestShape();

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_READ_TREE_H_
