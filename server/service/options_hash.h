#ifndef PACKSCHED_SERVER_SERVICE_OPTIONS_HASH_H_
#define PACKSCHED_SERVER_SERVICE_OPTIONS_HASH_H_

// The options fingerprint: what the ranks of a round compare (RoundRecord::options_hash; a
// round whose ranks bring different ones fails) and the start of a request's content hash.

#include <cstdint>

#include "server/planner/loss_weights.h"
#include "server/planner/options.h"
#include "server/service/round_types.h"

namespace packsched::service {

// Fingerprint of kProtocolVersion, every plan option of `options` in proto field order (the
// table PACKSCHED_PLAN_OPTIONS of server/planner/schema.h), the round's options of `round`
// (PACKSCHED_ROUND_OPTIONS), whether the plan has loss weights, then every option of `loss`:
// everything that changes k or the weights. Stable across processes and builds (Fingerprint64
// of the values, doubles by their bits), so ranks can compare it.
uint64_t OptionsHash(const planner::PlanOptions& options, const PlanInput& round, bool has_loss,
                     const planner::LossOptions& loss);

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_OPTIONS_HASH_H_
