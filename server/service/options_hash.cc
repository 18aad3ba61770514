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

uint64_t OptionsHash(const planner::PlanOptions& o, const PlanInput& round, bool has_loss,
                     const planner::LossOptions& loss) {
#define PACKSCHED_HASH_PLAN(name, number, Rule, Type, member, json, help) HashValue(o.member),
#define PACKSCHED_HASH_ROUND(name, number, dflt) HashValue(round.name),
#define PACKSCHED_HASH_LOSS(name, number, Rule, Type, member, key) HashValue(loss.member),
  const int64_t fields[] = {kProtocolVersion,
                            PACKSCHED_PLAN_OPTIONS(PACKSCHED_HASH_PLAN)
                                PACKSCHED_ROUND_OPTIONS(PACKSCHED_HASH_ROUND) has_loss,
                            PACKSCHED_LOSS_OPTIONS(PACKSCHED_HASH_LOSS)};
#undef PACKSCHED_HASH_PLAN
#undef PACKSCHED_HASH_ROUND
#undef PACKSCHED_HASH_LOSS
  uint64_t h = kFingerprintSeed;
  for (int64_t field : fields) h = Fingerprint64(field, h);
  return h;
}

}  // namespace packsched::service
