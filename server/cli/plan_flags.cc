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
#include "server/planner/options.h"

ABSL_FLAG(std::string, lengths, "",
          "file of sequence lengths: one integer per line, or a JSON array (default: stdin)");
ABSL_FLAG(int64_t, max_token_len, 0,
          "cap per micro-batch in tokens (see --cap_mode); required unless --num_parts is set");
ABSL_FLAG(int64_t, num_parts, 0,
          "split into exactly this many micro-batches (kk or lpt; no cap needed); 0 = the fewest "
          "that meet the cap");
ABSL_FLAG(bool, equal_size, false,
          "with --num_parts: every micro-batch gets n / K sequences (the cap is not guaranteed)");
ABSL_FLAG(std::string, algorithm, "kk",
          "kk | lpt (balanced micro-batches), ffd | bfd | sequential (dataset packing: as many "
          "bins as needed)");
ABSL_FLAG(std::string, cap_mode, "tokens",
          "tokens (sum of aligned lengths) | padded (sequences x longest aligned length)");
ABSL_FLAG(int64_t, max_seqs_per_micro_batch, 0, "most sequences in one micro-batch; 0 = no limit");
ABSL_FLAG(int64_t, min_micro_batches, 1, "the plan has at least this many micro-batches");
ABSL_FLAG(int64_t, divisible_by, 1,
          "the micro-batch count is a multiple of this (pipeline parallelism)");
ABSL_FLAG(int64_t, align_to, 1, "each sequence is padded to a multiple of this (e.g. 2*tp*cp)");
ABSL_FLAG(int64_t, align_total_to, 1,
          "each micro-batch's total is padded to a multiple of this (e.g. Ulysses SP)");
ABSL_FLAG(std::string, cost, "tokens",
          "what balancing equalises: tokens | attention (a*L + b*L^2, see --attention_cost)");
ABSL_FLAG(std::string, attention_cost, "",
          "A,B: integer weights of --cost=attention, cost = A*L + B*L^2 (default 24576,1)");
ABSL_FLAG(std::string, overlong, "reject",
          "a sequence longer than the cap: reject (error) | isolate (own micro-batch) | drop");
ABSL_FLAG(std::string, order, "cost_desc",
          "micro-batch order: cost_desc | index | interleave (large in the middle)");
ABSL_FLAG(int64_t, max_micro_batches, packsched::planner::kDefaultMaxMicroBatches,
          "fail if the plan needs more micro-batches than this");
ABSL_FLAG(std::string, format, "table", "output: table (for people) | json (for programs)");

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

absl::StatusOr<planner::AttentionCost> ParseAttentionCost(const std::string& value) {
  const std::vector<absl::string_view> fields = absl::StrSplit(value, ',');
  planner::AttentionCost cost;
  if (fields.size() != 2 || !absl::SimpleAtoi(fields[0], &cost.linear) ||
      !absl::SimpleAtoi(fields[1], &cost.quadratic)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--attention_cost=", value, ": expected two integers A,B (e.g. 24576,1)"));
  }
  return cost;
}

}  // namespace

absl::StatusOr<PlanRequest> RequestFromFlags() {
  PlanRequest r;
  planner::PlanOptions& o = r.options;
  r.num_parts = absl::GetFlag(FLAGS_num_parts);
  o.max_token_len = absl::GetFlag(FLAGS_max_token_len);
  o.equal_size = absl::GetFlag(FLAGS_equal_size);
  o.max_seqs_per_micro_batch = absl::GetFlag(FLAGS_max_seqs_per_micro_batch);
  o.min_micro_batches = absl::GetFlag(FLAGS_min_micro_batches);
  o.divisible_by = absl::GetFlag(FLAGS_divisible_by);
  o.align_to = absl::GetFlag(FLAGS_align_to);
  o.align_total_to = absl::GetFlag(FLAGS_align_total_to);
  o.max_micro_batches = absl::GetFlag(FLAGS_max_micro_batches);
  ASSIGN_OR_RETURN(o.algorithm,
                   ParseFlag("algorithm", absl::GetFlag(FLAGS_algorithm), planner::ParseAlgorithm));
  ASSIGN_OR_RETURN(o.cap_mode,
                   ParseFlag("cap_mode", absl::GetFlag(FLAGS_cap_mode), planner::ParseCapMode));
  ASSIGN_OR_RETURN(o.cost, ParseFlag("cost", absl::GetFlag(FLAGS_cost), planner::ParseCostModel));
  ASSIGN_OR_RETURN(o.overlong, ParseFlag("overlong", absl::GetFlag(FLAGS_overlong),
                                         planner::ParseOverlongPolicy));
  ASSIGN_OR_RETURN(o.order,
                   ParseFlag("order", absl::GetFlag(FLAGS_order), planner::ParsePartOrder));
  const std::string attention = absl::GetFlag(FLAGS_attention_cost);
  if (!attention.empty()) {
    if (o.cost != planner::CostModel::kAttention) {
      return absl::InvalidArgumentError(
          absl::StrCat("--attention_cost=", attention, " applies only with --cost=attention"));
    }
    ASSIGN_OR_RETURN(o.attention, ParseAttentionCost(attention));
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

std::string HelpText() {
  std::string out =
      "packsched plan: groups sequences into micro-batches under a token cap (offline).\n"
      "\n"
      "usage: packsched plan [--lengths=FILE] (--max_token_len=TOKENS | --num_parts=K) "
      "[flags]\n"
      "\n"
      "Reads lengths (one integer per line, or a JSON array) from --lengths or stdin and\n"
      "prints the plan on stdout as a table or as JSON. Errors go to stderr with a\n"
      "non-zero exit status (2 for a usage error such as a missing cap).\n"
      "\n"
      "examples:\n"
      "  packsched plan --lengths=lengths.txt --max_token_len=16384\n"
      "  echo '[1,2,2,5,3,7,6,3]' | packsched plan --num_parts=4 --format=json\n"
      "  packsched plan --lengths=lengths.txt --algorithm=bfd --max_token_len=10240\n"
      "\n"
      "flags:\n";
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
