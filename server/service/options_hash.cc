#include "server/service/options_hash.h"

#include <cstring>
#include <type_traits>

#include "server/base/fingerprint.h"
#include "server/planner/schema.h"

namespace packsched::service {
namespace {

uint64_t DoubleBits(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

int64_t HashValue(int64_t v) { return v; }
int64_t HashValue(bool v) { return v; }
int64_t HashValue(double v) { return static_cast<int64_t>(DoubleBits(v)); }
template <typename Enum, typename = std::enable_if_t<std::is_enum_v<Enum>>>
int64_t HashValue(Enum v) {
  return static_cast<int64_t>(v);
}

}  // namespace

// OptionsHash lists one value per row of PACKSCHED_PLAN_OPTIONS, PACKSCHED_ROUND_OPTIONS and
// PACKSCHED_LOSS_OPTIONS, each macro taking the struct it reads: the rows
//   X(max_token_len, 1, Cap, int64, max_token_len, 1, "...")
//   X(same_micro_num_in_dp, 16, true)
//   X(mode, 1, Enum, LossMode, mode, loss_mode)
// expand, through PACKSCHED_HASH_PLAN, PACKSCHED_HASH_ROUND and PACKSCHED_HASH_LOSS, to
//   HashValue(o.max_token_len), HashValue(round.same_micro_num_in_dp), HashValue(loss.mode),
#define PACKSCHED_HASH_MEMBER(object, member) HashValue((object).member),
#define PACKSCHED_HASH_PLAN(name, number, Rule, Type, member, json, help) \
  PACKSCHED_HASH_MEMBER(o, member)
#define PACKSCHED_HASH_ROUND(name, number, dflt) PACKSCHED_HASH_MEMBER(round, name)
#define PACKSCHED_HASH_LOSS(name, number, Rule, Type, member, key) \
  PACKSCHED_HASH_MEMBER(loss, member)

// The values in proto field order (the same fingerprint as before the schema table), then
// whether the plan has loss weights, then the loss options.
uint64_t OptionsHash(const planner::PlanOptions& o, const PlanInput& round, bool has_loss,
                     const planner::LossOptions& loss) {
  const int64_t fields[] = {kProtocolVersion,
                            PACKSCHED_PLAN_OPTIONS(PACKSCHED_HASH_PLAN)
                                PACKSCHED_ROUND_OPTIONS(PACKSCHED_HASH_ROUND) has_loss,
                            PACKSCHED_LOSS_OPTIONS(PACKSCHED_HASH_LOSS)};
  uint64_t h = kFingerprintSeed;
  for (int64_t field : fields) h = Fingerprint64(field, h);
  return h;
}

}  // namespace packsched::service
