#ifndef PACKSCHED_SERVER_CLI_PROGRESS_H_
#define PACKSCHED_SERVER_CLI_PROGRESS_H_

// Progress lines on stderr for a long `packsched plan` run (10^7 lengths take minutes): nothing
// for a run shorter than `first`, then one line every `every` naming the current phase and the
// time so far, and a closing line when the run ends.

#include <cstdio>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace packsched::cli {

class Progress {
 public:
  // Starts the clock and the reporting thread, in phase `phase`; lines go to `out` (REQUIRES:
  // outlives this).
  Progress(FILE* out, absl::Duration first, absl::Duration every, std::string phase);
  // Stops the thread; prints the closing line if any line was printed.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The phase the next lines name ("planning 10000000 sequences"). Thread-safe.
  void Phase(std::string phase);

 private:
  void Run();

  FILE* const out_;
  const absl::Duration first_;
  const absl::Duration every_;
  const absl::Time start_;
  absl::Mutex mu_;
  std::string phase_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace packsched::cli

#endif  // PACKSCHED_SERVER_CLI_PROGRESS_H_
