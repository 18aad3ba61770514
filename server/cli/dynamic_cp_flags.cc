#include "server/cli/dynamic_cp_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/planner/dynamic_cp.h"
#include "server/planner/dynamic_cp_model.h"
#include "server/planner/options.h"
#include "server/planner/schema.h"

ABSL_FLAG(bool, dynamic_cp, false,
          "plan dynamic context parallelism: the lengths are one step over --world_size ranks and "
          "the cap is on one rank's rows; each sequence runs on a CP group of the size it needs "
          "(see the flags that say 'with --dynamic_cp')");

// One flag per Own row of PACKSCHED_DYNAMIC_CP_OPTIONS (server/planner/schema.h), named by its
// `flag` column, with its help and the planner's default; a Plan row's flag is declared (it is
// `packsched plan`'s, plan_flags.cc). The row
//   X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "with --dynamic_cp: ...")
// expands, through PACKSCHED_DCP_FLAG, to
//   ABSL_FLAG(int64_t, min_cp, packsched::planner::DynamicCpOptions{}.min_cp, "with ...");
#define PACKSCHED_DCP_FLAG_INT(flag, member, help) \
  ABSL_FLAG(int64_t, flag, packsched::planner::DynamicCpOptions{}.member, help);
#define PACKSCHED_DCP_FLAG_Cap PACKSCHED_DCP_FLAG_INT
#define PACKSCHED_DCP_FLAG_Int PACKSCHED_DCP_FLAG_INT
#define PACKSCHED_DCP_FLAG_MaxCp PACKSCHED_DCP_FLAG_INT
#define PACKSCHED_DCP_FLAG_Weight PACKSCHED_DCP_FLAG_INT
#define PACKSCHED_DCP_FLAG_Nodes PACKSCHED_DCP_FLAG_INT
#define PACKSCHED_DCP_FLAG_Enum(flag, member, help)                                               \
  ABSL_FLAG(std::string, flag,                                                                    \
            std::string(packsched::planner::Name(packsched::planner::DynamicCpOptions{}.member)), \
            help);
#define PACKSCHED_DCP_FLAG_Ratio(flag, member, help) \
  ABSL_FLAG(double, flag, packsched::planner::CpModelLinks{}.member, help);
#define PACKSCHED_DCP_FLAG_Bytes(flag, member, help) \
  ABSL_FLAG(int64_t, flag, packsched::planner::CpModelLinks{}.member, help);
#define PACKSCHED_DCP_FLAG_Own(Rule, flag, member, help) \
  PACKSCHED_DCP_FLAG_##Rule(flag, member, help)
#define PACKSCHED_DCP_FLAG_Plan(Rule, flag, member, help) ABSL_DECLARE_FLAG(int64_t, flag);
#define PACKSCHED_DCP_FLAG(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_DCP_FLAG_##Owner(Rule, flag, member, help)
PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_FLAG)

ABSL_DECLARE_FLAG(int64_t, num_parts);
ABSL_DECLARE_FLAG(std::string, sync);
ABSL_DECLARE_FLAG(int64_t, micro_batch_cost);
ABSL_DECLARE_FLAG(std::string, tree);

namespace packsched::cli {
namespace {

// Whether `flag` holds a value other than its default (set on the command line, a flagfile or
// the environment).
bool Specified(absl::string_view flag) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(flag);
  return f != nullptr && f->CurrentValue() != f->DefaultValue();
}

// A dynamic-CP flag that does not apply: set without --dynamic_cp; a cost weight the model
// replaces; a link ratio without the model.
absl::Status Misplaced(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", why));
}

}  // namespace

bool DynamicCpFromFlags() { return absl::GetFlag(FLAGS_dynamic_cp); }

// DynamicCpRequestFromFlags reads each row's flag into its member, by rule, after checking the
// flag applies. The row
//   X(min_cp, 3, Int, int64, min_cp, min_cp, Own, "...")
// expands, through PACKSCHED_DCP_FROM_FLAG, to
//   if (!dynamic && Specified("min_cp")) return Misplaced("min_cp", "applies only with ...");
//   r.options.min_cp = absl::GetFlag(FLAGS_min_cp);
#define PACKSCHED_DCP_APPLIES_Own(flag)                        \
  if (!dynamic && Specified(#flag)) {                          \
    return Misplaced(#flag, "applies only with --dynamic_cp"); \
  }
#define PACKSCHED_DCP_APPLIES_Plan(flag)
#define PACKSCHED_DCP_FROM_INT(r, flag, member) (r).options.member = absl::GetFlag(FLAGS_##flag);
#define PACKSCHED_DCP_FROM_Cap PACKSCHED_DCP_FROM_INT
#define PACKSCHED_DCP_FROM_Int PACKSCHED_DCP_FROM_INT
#define PACKSCHED_DCP_FROM_MaxCp PACKSCHED_DCP_FROM_INT
#define PACKSCHED_DCP_FROM_Nodes PACKSCHED_DCP_FROM_INT
#define PACKSCHED_DCP_FROM_Weight(r, flag, member)                                    \
  if (plan.model && Specified(#flag)) {                                               \
    return Misplaced(#flag, "does not apply with --model_config (the model's cost)"); \
  }                                                                                   \
  (r).options.member = absl::GetFlag(FLAGS_##flag);
#define PACKSCHED_DCP_FROM_Enum(r, flag, member)                                             \
  {                                                                                          \
    const std::string value = absl::GetFlag(FLAGS_##flag);                                   \
    absl::StatusOr<planner::CpSizeRule> parsed = planner::ParseCpSizeRule(value);            \
    if (!parsed.ok()) {                                                                      \
      return absl::InvalidArgumentError(                                                     \
          absl::StrCat("--" #flag "=", value, ": expected powers_of_two, divisors or any")); \
    }                                                                                        \
    (r).options.member = *parsed;                                                            \
  }
#define PACKSCHED_DCP_FROM_LINK(r, flag, member)                 \
  if (!plan.model && Specified(#flag)) {                         \
    return Misplaced(#flag, "applies only with --model_config"); \
  }                                                              \
  (r).links.member = absl::GetFlag(FLAGS_##flag);
#define PACKSCHED_DCP_FROM_Ratio PACKSCHED_DCP_FROM_LINK
#define PACKSCHED_DCP_FROM_Bytes PACKSCHED_DCP_FROM_LINK
#define PACKSCHED_DCP_FROM_FLAG(name, number, Rule, Type, member, flag, Owner, help) \
  PACKSCHED_DCP_APPLIES_##Owner(flag) if (dynamic) { PACKSCHED_DCP_FROM_##Rule(r, flag, member) }

absl::StatusOr<DynamicCpRequest> DynamicCpRequestFromFlags(const PlanRequest& plan) {
  const bool dynamic = DynamicCpFromFlags();
  DynamicCpRequest r;
  PACKSCHED_DYNAMIC_CP_OPTIONS(PACKSCHED_DCP_FROM_FLAG)
  if (!dynamic) return r;
  if (plan.world_size < 1) {
    return absl::InvalidArgumentError(
        "--dynamic_cp needs --world_size=R: the ranks the step runs on (dp x cp_max)");
  }
  if (plan.num_parts != 0 || plan.balance.sync != planner::Sync::kStep ||
      plan.balance.micro_batch_cost != 0 || !absl::GetFlag(FLAGS_tree).empty()) {
    return absl::InvalidArgumentError(
        "--dynamic_cp plans slots under the cap: not with --num_parts, --sync, "
        "--micro_batch_cost or --tree");
  }
  r.options.ranks = plan.world_size;
  r.model = plan.model;
  RETURN_IF_ERROR(CheckDynamicCpRequest(r));
  return r;
}

}  // namespace packsched::cli
