#include "server/cli/plan_flags.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
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
#include "absl/strings/strip.h"
#include "server/base/file_check.h"
#include "server/base/status_macros.h"
#include "server/cli/read_lengths.h"
#include "server/cli/read_model_config.h"
#include "server/cli/read_tree.h"
#include "server/planner/options.h"
#include "server/planner/schema.h"

ABSL_FLAG(std::string, tree, "",
          absl::StrCat("file of a forest of rollouts as JSON (", packsched::cli::ForestShape(),
                       "): tree packing, each shared token once (instead of --lengths)"));
ABSL_FLAG(std::string, lengths, "",
          "file of sequence lengths: one integer per line, a JSON array, or JSON Lines with "
          "--length_field or --token_field (default: stdin)");
ABSL_FLAG(std::string, length_field, "",
          "JSON Lines input (one object per line): the integer field that holds each length");
ABSL_FLAG(std::string, token_field, "",
          "JSON Lines input (one object per line): the array field (token ids) whose number of "
          "elements is each length");
ABSL_FLAG(bool, progress, true,
          "report on stderr while a run that passes 3 s goes on (every 10 s, and at the end)");
ABSL_FLAG(int64_t, num_parts, 0,
          "split into exactly this many micro-batches (kk or lpt; no cap needed); 0 = the fewest "
          "that meet the cap");

// One flag per option of the schema table (server/planner/schema.h), named as the option, with
// the table's help text and the planner's default. The row
//   X(min_micro_batches, 4, Count, int64, min_micro_batches, 5, "the plan has at least ...")
// expands, through PACKSCHED_PLAN_FLAG, to
//   ABSL_FLAG(int64_t, min_micro_batches, packsched::planner::PlanOptions{}.min_micro_batches,
//             "the plan has at least ...");
// The Weight fields have no flag of their own: they are one pair flag, below.
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
#define PACKSCHED_PLAN_FLAG(name, number, Rule, Type, member, json, help) \
  PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_PLAN_FLAG, Rule, Weight)(name, member, help)
PACKSCHED_PLAN_OPTIONS(PACKSCHED_PLAN_FLAG)

// The Weight options together: "A,B" in table order. PACKSCHED_WEIGHT_PAIR expands to
//   ABSL_FLAG(std::string, attention_cost, "", "A,B: integer weights of --cost=attention, ...");
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

// ParsePair reads the Weight rows of PACKSCHED_PLAN_OPTIONS, one field of "A,B" each, in table
// order (the other rules are not part of the pair: nothing to do). The row
//   X(attention_linear, 10, Weight, int64, attention.linear, 10, "")
// expands, through PACKSCHED_PAIR, to
//   ok = ok && next < fields.size() && absl::SimpleAtoi(fields[next++], &parsed.attention.linear);
#define PACKSCHED_PAIR_Weight(fields, next, parsed, ok, member) \
  (ok) = (ok) && (next) < (fields).size() && absl::SimpleAtoi((fields)[(next)++], &(parsed).member);
#define PACKSCHED_PAIR(name, number, Rule, Type, member, json, help) \
  PACKSCHED_SCHEMA_ONLY(PACKSCHED_PAIR, Rule, Weight)(fields, next, parsed, ok, member)

// "A,B" into the Weight options of `o`, in table order.
absl::Status ParsePair(const std::string& value, planner::PlanOptions& o) {
  const std::vector<absl::string_view> fields = absl::StrSplit(value, ',');
  planner::PlanOptions parsed = o;
  size_t next = 0;
  bool ok = true;
  PACKSCHED_PLAN_OPTIONS(PACKSCHED_PAIR)
  if (!ok || next != fields.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--", PACKSCHED_WEIGHT_PAIR_KEY, "=", value,
                                                   ": expected two integers A,B (e.g. 24576,1)"));
  }
  // The pair's own words for the planner's ranges (it would name the fields, not this flag).
  for (const int64_t weight : {parsed.attention.linear, parsed.attention.quadratic}) {
    if (weight < 0 || weight > planner::kMaxAttentionWeight) {
      return absl::InvalidArgumentError(absl::StrCat("--", PACKSCHED_WEIGHT_PAIR_KEY, "=", value,
                                                     ": each weight must be 0..",
                                                     planner::kMaxAttentionWeight));
    }
  }
  if (parsed.attention.linear == 0 && parsed.attention.quadratic == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", PACKSCHED_WEIGHT_PAIR_KEY, "=", value,
                                                   ": both weights 0 make every cost 0"));
  }
  o = parsed;
  return absl::OkStatus();
}

}  // namespace

// RequestFromFlags reads the flags into the options `o`, by rule (server/planner/schema.h), in
// the CLI's order: the row whose `json` column is `position` on each turn (so the first bad enum
// name is the one reported; names are checked by the planner's parsers). The Weight fields are
// the pair flag's, read after. The row
//   X(cap_mode, 2, Enum, CapMode, cap_mode, 3, "tokens ... | padded ...")
// expands, through PACKSCHED_FROM_FLAG, to
//   if (position == 3) {
//     ASSIGN_OR_RETURN(o.cap_mode, ParseFlag("cap_mode", absl::GetFlag(FLAGS_cap_mode),
//                                            planner::ParseCapMode));
//   }
#define PACKSCHED_FROM_FLAG_INT(o, name, Type, member) (o).member = absl::GetFlag(FLAGS_##name);
#define PACKSCHED_FROM_FLAG_Cap PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Unlimited PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Count PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Align PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Ceiling PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_FixedK PACKSCHED_FROM_FLAG_INT
#define PACKSCHED_FROM_FLAG_Enum(o, name, Type, member)                                    \
  {                                                                                        \
    ASSIGN_OR_RETURN((o).member,                                                           \
                     ParseFlag(#name, absl::GetFlag(FLAGS_##name), planner::Parse##Type)); \
  }
#define PACKSCHED_FROM_FLAG(name, number, Rule, Type, member, json, help)             \
  if (position == (json)) {                                                           \
    PACKSCHED_SCHEMA_EXCEPT(PACKSCHED_FROM_FLAG, Rule, Weight)(o, name, Type, member) \
  }
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
    absl::StatusOr<std::string> text = ReadInput(path);
    absl::StatusOr<ModelFields> model =
        text.ok() ? ParseModelConfig(*text, path) : absl::StatusOr<ModelFields>(text.status());
    if (!model.ok()) {
      // Named by the flag: "--model_config=PATH: <why>" (the reader's message names the path).
      absl::string_view why = model.status().message();
      absl::ConsumePrefix(&why, absl::StrCat(path, ": "));
      return absl::InvalidArgumentError(absl::StrCat("--model_config=", path, ": ", why));
    }
    r.model = *std::move(model);
  }
  // In the CLI's order (the table's `json` column): the first bad name is the one reported.
  for (int position = 0; position < std::ssize(planner::schema::kPlanOptions); ++position) {
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

absl::StatusOr<std::optional<JsonlField>> JsonlFieldFromFlags() {
  const std::string length = absl::GetFlag(FLAGS_length_field);
  const std::string tokens = absl::GetFlag(FLAGS_token_field);
  if (!length.empty() && !tokens.empty()) {
    return absl::InvalidArgumentError(
        "--length_field and --token_field name the same thing two ways: give one");
  }
  if (!length.empty()) return JsonlField{JsonlField::Kind::kLength, length};
  if (!tokens.empty()) return JsonlField{JsonlField::Kind::kTokens, tokens};
  return std::nullopt;
}

bool ProgressFromFlags() { return absl::GetFlag(FLAGS_progress); }

namespace {

absl::Status CheckPath(absl::string_view flag, const std::string& path, bool input) {
  if (path.empty() || (input && path == "-")) return absl::OkStatus();
  const absl::Status s = input ? CheckReadableInput(path) : CheckReadableFile(path);
  if (s.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", path, ": ", s.message()));
}

}  // namespace

absl::Status CheckInputFlags() {
  RETURN_IF_ERROR(CheckPath("lengths", absl::GetFlag(FLAGS_lengths), /*input=*/true));
  RETURN_IF_ERROR(CheckPath("tree", absl::GetFlag(FLAGS_tree), /*input=*/true));
  return CheckPath("model_config", absl::GetFlag(FLAGS_model_config), /*input=*/false);
}

std::string HelpText() {
  const absl::string_view cap = planner::schema::OptionNamed("Cap");
  std::string out = absl::StrCat(
      "packsched plan: groups sequences into micro-batches under a token cap (offline).\n"
      "\n"
      "usage: packsched plan [--lengths=FILE] (--",
      cap,
      "=TOKENS | --num_parts=K) [flags]\n"
      "\n"
      "Reads lengths (one integer per line, a JSON array, or JSON Lines records with\n"
      "--length_field or --token_field) from --lengths or stdin and\n"
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
      "  packsched plan --lengths=data.jsonl --token_field=input_ids --",
      cap,
      "=16384\n"
      "  packsched plan --lengths=lengths.txt --dynamic_cp --world_size=8 --",
      cap,
      "=8192 --cp_quadratic=1\n"
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
