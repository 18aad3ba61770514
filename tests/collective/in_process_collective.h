#ifndef PACKSCHED_TESTS_COLLECTIVE_IN_PROCESS_COLLECTIVE_H_
#define PACKSCHED_TESTS_COLLECTIVE_IN_PROCESS_COLLECTIVE_H_

// A group of N ranks inside one process, exchanging through shared memory (test-only: the
// packsched::testing_in_process_collective library, linked by tests alone): the fast harness
// for tests of everything above the collective (round agreement, the service's coordinator),
// with the failure behaviour of a real backend — a rank that does not arrive makes the others
// time out (naming it), and an abort or a timeout breaks the group for every rank.

#include <cstdint>
#include <memory>
#include <vector>

#include "server/collective/collective.h"

namespace packsched::collective {

// Creates `world_size` >= 1 connected ranks; element r is rank r. Each may be moved to its own
// thread. The shared state lives as long as any of them.
std::vector<std::unique_ptr<Collective>> CreateInProcessGroup(int64_t world_size);

}  // namespace packsched::collective

#endif  // PACKSCHED_TESTS_COLLECTIVE_IN_PROCESS_COLLECTIVE_H_
