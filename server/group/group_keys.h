#ifndef PACKSCHED_SERVER_GROUP_GROUP_KEYS_H_
#define PACKSCHED_SERVER_GROUP_GROUP_KEYS_H_

// clang-format off
// The layout of the rendezvous store, in one place (every rank must compute the same keys):
//
//   <root>epoch                                   run epoch, written by rank 0
//   <root><epoch>/backend                         the agreed backend ("gloo" / "nccl")
//   <root><epoch>/nccl_capable/<rank>             "1" / "0", for --backend=auto
//   <root><epoch>/member/<rank>                   a rank's sidecar has joined the run (readiness)
//   <root><epoch>/complete                        every rank has joined (written by rank 0)
//   <root><epoch>/replicated/<rank>               a rank has written every agreed result it
//                                                 keeps into this epoch (result_replica.h)
//   <root><epoch>/all_replicated                  every rank but rank 0 has its replicated/
//                                                 mark here (written by rank 0: one read
//                                                 tells a lookup what W - 1 reads would)
//   <root><epoch>/not_ready/<rank>/               why this rank's own side of its last
//                                                 formation failed (its transport could not
//                                                 come up: an interface it cannot bind, ...;
//                                                 at most kNotReadyReasonBytes)
//   <root><epoch>/s/<stream>/generation           the stream's current generation (decimal)
//   <root><epoch>/s/<stream>/g<gen>/joined/<rank> a rank came to form this generation
//   <root><epoch>/s/<stream>/g<gen>/<backend>/... the backend's own rendezvous keys
//   <root><epoch>/s/<stream>/g<gen>/timeout/<round>/  why a round of this generation timed out
//   <root><epoch>/s/<stream>/g<gen>/arrive/<round>/<rank>/  a rank is waiting in this round of
//                                                 this generation (slow rounds only)
//   <root><epoch>/s/<stream>/g<gen>/not_ready     the first rank that failed this generation's
//                                                 formation on its own side (its reason is
//                                                 under not_ready/<rank>/; first writer wins)
//   <root><epoch>/s/<stream>/g<gen>/ended         what ended it: "round <r>", "formation",
//                                                 "restart"
//   <root><epoch>/s/<stream>/result/<round>/      the agreed result of a finished round (written
//                                                 by every rank that agreed it; rank 0 deletes
//                                                 those older than its last kept_results)
//
// Everything under g<gen>/ is deleted by rank 0 once every rank is in a later generation.
//
// Store growth while the group cannot form again (a rank down, a peer stuck): until then each
// ended generation keeps what it wrote — at most 3W + 2 keys for one that failed to form
// (joined/, the backend's peer_addresses/ and connected/ per rank, gloo/unconnected, ended) and
// 4W + 2 for one ended by a failed round (its formation's 3W, arrive/ for each rank still waiting
// 100 ms into the round, timeout/<round>/, ended). A stream ends at most one generation per call
// (Plan round; two on a restarted rank's first call), so an outage of N failed rounds on S
// streams holds at most about S·N·(4W + 2) extra keys, all deleted by rank 0 when the group forms
// again (up to 64 generations per formation, 8 per completed round). They are not deleted as
// each failure settles: a rank may read joined/, arrive/ and connected/ to explain the failure
// until its own deadline plus the cleanup margin, so only rank 0 could delete them, after that
// (not done: kept simple).

// Keys deleted by DeletePrefix end with '/' so that deleting round 5 never touches round 50.
// <stream> is the stream name's fingerprint in hex, so any name (with '/' or not) is one path
// segment.
// clang-format on

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "server/base/fingerprint.h"

namespace packsched::group::keys {

inline std::string Epoch(absl::string_view root) { return absl::StrCat(root, "epoch"); }

inline std::string EpochRoot(absl::string_view root, absl::string_view epoch) {
  return absl::StrCat(root, epoch, "/");
}

inline std::string Backend(absl::string_view epoch_root) {
  return absl::StrCat(epoch_root, "backend");
}

inline std::string NcclCapable(absl::string_view epoch_root, int64_t rank) {
  return absl::StrCat(epoch_root, "nccl_capable/", rank);
}

inline std::string Member(absl::string_view epoch_root, int64_t rank) {
  return absl::StrCat(epoch_root, "member/", rank);
}

inline std::string Complete(absl::string_view epoch_root) {
  return absl::StrCat(epoch_root, "complete");
}

inline std::string Replicated(absl::string_view epoch_root, int64_t rank) {
  return absl::StrCat(epoch_root, "replicated/", rank);
}

inline std::string AllReplicated(absl::string_view epoch_root) {
  return absl::StrCat(epoch_root, "all_replicated");
}

// At most this many bytes of a rank's reason are kept under NotReady.
inline constexpr size_t kNotReadyReasonBytes = 512;

inline std::string NotReady(absl::string_view epoch_root, int64_t rank) {
  return absl::StrCat(epoch_root, "not_ready/", rank, "/");
}

inline std::string FormationNotReady(absl::string_view formation) {
  return absl::StrCat(formation, "not_ready");
}

inline std::string StreamRoot(absl::string_view epoch_root, absl::string_view stream) {
  return absl::StrFormat("%ss/%016x/", epoch_root, Fingerprint64(stream));
}

inline std::string Generation(absl::string_view stream_root) {
  return absl::StrCat(stream_root, "generation");
}

inline std::string Formation(absl::string_view stream_root, int64_t generation) {
  return absl::StrCat(stream_root, "g", generation, "/");
}

inline std::string Joined(absl::string_view formation, int64_t rank) {
  return absl::StrCat(formation, "joined/", rank);
}

// Why generation g ended: "round <r>", "formation" or "restart" (first writer wins).
inline std::string Ended(absl::string_view formation) { return absl::StrCat(formation, "ended"); }

inline std::string ArrivalPrefix(absl::string_view formation, int64_t round) {
  return absl::StrCat(formation, "arrive/", round, "/");
}

inline std::string Arrival(absl::string_view formation, int64_t round, int64_t rank) {
  return absl::StrCat(ArrivalPrefix(formation, round), rank, "/");
}

inline std::string Result(absl::string_view stream_root, int64_t round) {
  return absl::StrCat(stream_root, "result/", round, "/");
}

inline std::string Timeout(absl::string_view formation, int64_t round) {
  return absl::StrCat(formation, "timeout/", round, "/");
}

}  // namespace packsched::group::keys

#endif  // PACKSCHED_SERVER_GROUP_GROUP_KEYS_H_
