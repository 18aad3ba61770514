#ifndef PACKSCHED_SERVER_CLI_TABLE_OUTPUT_H_
#define PACKSCHED_SERVER_CLI_TABLE_OUTPUT_H_

// `packsched plan --format=table`: the plan for people.

#include <string>

#include "server/cli/plan_command.h"

namespace packsched::cli {

// A header line, one row per micro-batch in plan order (index, sequences, tokens, cost, a fill
// bar and percentage against the cap — against the largest part when there is no cap — and
// flags: empty, overlong, over cap), then a summary: k with its lower and local bounds, max /
// mean cost, parts over the cap, dropped sequences, the padding a naive [n, longest] batch
// would have had against the packed total, and the planning time.
std::string PlanTable(const PlanRun& run);

// `width` characters: '#' for the filled share `fraction` (clamped to [0, 1], rounded to the
// nearest character), ' ' for the rest.
std::string FillBar(double fraction, int width);

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_TABLE_OUTPUT_H_
