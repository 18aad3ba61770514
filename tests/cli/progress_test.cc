// Progress: silent for a short run; for a long one, lines naming the phase and a closing line.

#include "server/cli/progress.h"

#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace packsched::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What `run` printed through a Progress writing to a temporary file.
template <typename Fn>
std::string Printed(absl::Duration first, Fn run) {
  FILE* file = std::tmpfile();
  {
    Progress progress(file, first, absl::Hours(1), "planning 3 sequences");
    run(file);
  }
  std::string out(static_cast<size_t>(std::ftell(file)), '\0');
  std::rewind(file);
  out.resize(std::fread(out.data(), 1, out.size(), file));
  std::fclose(file);
  return out;
}

TEST(ProgressTest, ARunShorterThanTheFirstPeriodPrintsNothing) {
  EXPECT_EQ(Printed(absl::Hours(1), [](FILE*) {}), "");
}

TEST(ProgressTest, ALongRunNamesItsPhaseAndEnds) {
  const std::string out = Printed(absl::ZeroDuration(), [](FILE* file) {
    // The first period is zero: wait (at most 10 s) for the reporter's line.
    for (int i = 0; i < 10000 && std::ftell(file) == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  });
  EXPECT_THAT(out, StartsWith("packsched plan: planning 3 sequences, 0 s so far\n"));
  EXPECT_THAT(out, HasSubstr("packsched plan: done in 0."));
}

}  // namespace
}  // namespace packsched::cli
