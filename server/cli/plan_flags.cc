#include "server/cli/plan_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/base/status_macros.h"
#include "server/cli/read_lengths.h"
#include "server/cli/read_model_config.h"
#include "server/planner/options.h"
#include "server/planner/schema.h"

ABSL_FLAG(std::string, tree, "",
          "file of a forest of rollouts as JSON ({\"node_len\": [...], \"node_parent\": [...], "
          "\"rollout_leaf\": [...]}): tree packing, each shared token once (instead of --lengths)");
ABSL_FLAG(std::string, lengths, "",
          "file of sequence lengths: one integer per line, or a JSON array (default: stdin)");
ABSL_FLAG(int64_t, num_parts, 0,
          "split into exactly this many micro-batches (kk or lpt; no cap needed); 0 = the fewest "
          "that meet the cap");

// One flag per option of the schema table (server/planner/schema.h), named as the option, with
// the table's help text and the planner's default.
#define PACKSCHED_PLAN_FLAG_INT(name, member, help) \
  ABSL_FLAG(int64_t, name, packsched::planner::PlanOptions{}.member, help);
#define PACKSCHED_PLAN_FLAG_Cap PACKSCHED_PLAN_FLAG_INT
#define PACKSCHED_PLAN_FLAG_Unlimited PACKSCHED_PLAN_FLAG_INT
#define PACKSCHED_PLAN_FLAG_Count PACKSCHED_PLAN_FLAG_INT
#define PACKSCHED_PLAN_FLAG_Align PACKSCHED_PLAN_FLAG_INT
#define PACKSCHED_PLAN_FLAG_Ceiling PACKSCHED_PLAN_FLAG_INT
#define PACKSCHED_PLAN_FLAG_FixedK(name, member, help) \
  ABSL_FLAG(bool, name, packsched::planner::PlanOptions{}.member, help);
#define PACKSCHED_PLAN_FLAG_Enum(name, member, help)                                         \
  ABSL_FLAG(std::string, name,                                                               \
            std::string(packsched::planner::Name(packsched::planner::PlanOptions{}.member)), \
            help);
#define PACKSCHED_PLAN_FLAG_Weight PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_PLAN_FLAG(name, number, Rule, Type, member, json, help) \
  PACKSCHED_PLAN_FLAG_##Rule(name, member, help)
PACKSCHED_PLAN_OPTIONS(PACKSCHED_PLAN_FLAG)

// The Weight options together: "A,B" in table order.
#define PACKSCHED_PAIR_FLAG(pair)  \
  ABSL_FLAG(std::string, pair, "", \
            "A,B: integer weights of --cost=attention, cost = A*L + B*L^2 (default 24576,1)");
#define PACKSCHED_EXPAND_PAIR_FLAG(pair) PACKSCHED_PAIR_FLAG(pair)
PACKSCHED_EXPAND_PAIR_FLAG(PACKSCHED_WEIGHT_PAIR)
ABSL_FLAG(std::string, format, "table", "output: table (for people) | json (for programs)");
ABSL_FLAG(int64_t, world_size, 0,
          "coordinator mode: balance the whole batch over this many data-parallel ranks, one "
          "common micro-batch count (0 = one rank's plan)");
ABSL_FLAG(std::string, sync, "step",
          "coordinator mode: step (ranks meet once per step: balance rank totals) | micro_batch "
          "(ranks meet at every micro-batch, FSDP/PP/CP: balance every slot)");
ABSL_FLAG(std::string, model_config, "",
          "a Hugging Face style config.json: cost = attention with the model's FLOPs per token "
          "and per token pair, and (coordinator mode) a per-micro-batch cost worth 2,048 tokens");
ABSL_FLAG(int64_t, micro_batch_cost, 0,
          "coordinator mode: a fixed cost per non-empty micro-batch, in the cost's units");

namespace packsched::cli {
namespace {

// "--flag=value: reason" for an error from a name parser.
absl::Status FlagError(absl::string_view flag, absl::string_view value, const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", value, ": ", s.message()));
}

template <typename Enum>
absl::StatusOr<Enum> ParseFlag(absl::string_view flag, const std::string& value,
                               absl::StatusOr<Enum> (*parse)(absl::string_view)) {
  absl::StatusOr<Enum> parsed = parse(value);
  if (!parsed.ok()) return FlagError(flag, value, parsed.status());
  return parsed;
}

// "A,B" into the Weight options of `o`, in table order.
absl::Status ParsePair(const std::string& value, planner::PlanOptions& o) {
  const std::vector<absl::string_view> fields = absl::StrSplit(value, ',');
  planner::PlanOptions parsed = o;
  size_t next = 0;
  bool ok = true;
#define PACKSCHED_PAIR_Weight(member) \
  ok = ok && next < fields.size() && absl::SimpleAtoi(fields[next++], &parsed.member);
#define PACKSCHED_PAIR(name, number, Rule, Type, member, json, help) PACKSCHED_PAIR_##Rule(member)
#define PACKSCHED_PAIR_Cap(member)
#define PACKSCHED_PAIR_Enum(member)
#define PACKSCHED_PAIR_Unlimited(member)
#define PACKSCHED_PAIR_Count(member)
#define PACKSCHED_PAIR_Align(member)
#define PACKSCHED_PAIR_Ceiling(member)
#define PACKSCHED_PAIR_FixedK(member)
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_PAIR)
  if (!ok || next != fields.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--", PACKSCHED_WEIGHT_PAIR_KEY, "=", value,
                                                   ": expected two integers A,B (e.g. 24576,1)"));
  }
  o = parsed;
  return absl::OkStatus();
}

}  // namespace

// The flags into the options, by rule (server/planner/schema.h); names are checked by the
// planner's parsers.
#define PACKSCHED_FROM_FLAG_INT(name, Type, member) o.member = absl::GetFlag(FLAGS_##name);
#define PACKSCHED_FROM_FLAG_Cap PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Unlimited PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Count PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Align PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Ceiling PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_FixedK PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Weight PACKSCHED_SCHEMA_NOTHING
#define PACKSCHED_FROM_FLAG_Enum(name, Type, member)                                       \
  {                                                                                        \
    ASSIGN_OR_RETURN(o.member,                                                             \
                     ParseFlag(#name, absl::GetFlag(FLAGS_##name), planner::Parse##Type)); \
  }
#define PACKSCHED_FROM_FLAG(name, number, Rule, Type, member, json, help) \
  if (position == json) {                                                 \
    PACKSCHED_FROM_FLAG_##Rule(name, Type, member)                        \
  }
#define PACKSCHED_COUNT_FLAG(name, number, Rule, Type, member, json, help) +1
#define PACKSCHED_PAIR_FLAG_VALUE(pair) absl::GetFlag(FLAGS_##pair)
#define PACKSCHED_EXPAND_PAIR_FLAG_VALUE(pair) PACKSCHED_PAIR_FLAG_VALUE(pair)

absl::StatusOr<PlanRequest> RequestFromFlags() {
  PlanRequest r;
  planner::PlanOptions& o = r.options;
  r.num_parts = absl::GetFlag(FLAGS_num_parts);
  r.world_size = absl::GetFlag(FLAGS_world_size);
  r.balance.micro_batch_cost = absl::GetFlag(FLAGS_micro_batch_cost);
  ASSIGN_OR_RETURN(r.balance.sync,
                   ParseFlag("sync", absl::GetFlag(FLAGS_sync), planner::ParseSync));
  if (const std::string path = absl::GetFlag(FLAGS_model_config); !path.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadInput(path));
    ASSIGN_OR_RETURN(r.model, ParseModelConfig(text, path));
  }
  // In the CLI's order (the table's `json` column): the first bad name is the one reported.
  for (int position = 0; position < 0 PACKSCHED_PLAN_OPTIONS(PACKSCHED_COUNT_FLAG); ++position) {
    PACKSCHED_PLAN_OPTIONS(PACKSCHED_FROM_FLAG)
  }
  const std::string pair = PACKSCHED_EXPAND_PAIR_FLAG_VALUE(PACKSCHED_WEIGHT_PAIR);
  if (!pair.empty()) {
    if (o.cost != planner::CostModel::kAttention) {
      return absl::InvalidArgumentError(absl::StrCat("--", PACKSCHED_WEIGHT_PAIR_KEY, "=", pair,
                                                     " applies only with --cost=attention"));
    }
    RETURN_IF_ERROR(ParsePair(pair, o));
  }
  return r;
}

absl::StatusOr<OutputFormat> FormatFromFlags() {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "table") return OutputFormat::kTable;
  if (format == "json") return OutputFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--format=", format, ": expected one of: table, json"));
}

std::string LengthsPathFromFlags() { return absl::GetFlag(FLAGS_lengths); }

std::string TreePathFromFlags() { return absl::GetFlag(FLAGS_tree); }

std::string HelpText() {
  const absl::string_view cap = planner::schema::OptionNamed("Cap");
  std::string out = absl::StrCat(
      "packsched plan: groups sequences into micro-batches under a token cap (offline).\n"
      "\n"
      "usage: packsched plan [--lengths=FILE] (--",
      cap,
      "=TOKENS | --num_parts=K) [flags]\n"
      "\n"
      "Reads lengths (one integer per line, or a JSON array) from --lengths or stdin and\n"
      "prints the plan on stdout as a table or as JSON. Errors go to stderr with a\n"
      "non-zero exit status (2 for a usage error such as a missing cap).\n"
      "\n"
      "examples:\n"
      "  packsched plan --lengths=lengths.txt --",
      cap,
      "=16384\n"
      "  echo '[1,2,2,5,3,7,6,3]' | packsched plan --num_parts=4 --format=json\n"
      "  packsched plan --lengths=lengths.txt --algorithm=bfd --",
      cap,
      "=10240\n"
      "  packsched plan --tree=forest.json --",
      cap,
      "=16384 --format=json\n"
      "\n"
      "flags:\n");
  std::vector<std::pair<std::string, const absl::CommandLineFlag*>> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename().find("server/cli/") != std::string::npos) {
      flags.emplace_back(std::string(name), flag);
    }
  }
  std::sort(flags.begin(), flags.end());
  for (const auto& [name, flag] : flags) {
    const std::string value = flag->DefaultValue();
    absl::StrAppend(&out, "  --", name, value.empty() ? "" : absl::StrCat("=", value), "\n      ",
                    flag->Help(), "\n");
  }
  return out;
}

}  // namespace packsched::cli
