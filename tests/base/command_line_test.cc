// A command line checked as Abseil's parser reads it, before that parser (which exits 1): every
// error is one line naming the flag, flagfiles and the environment included.

#include "server/base/command_line.h"

#include <stdlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(int64_t, count, 1, "a number");
ABSL_FLAG(bool, verbose, false, "a switch");
ABSL_FLAG(std::string, mode, "", "a mode that means nothing empty");

namespace packsched {
namespace {

using ::packsched::testing::TempDir;

// The check's message for `args` (after the program name), "" when it passes.
std::string Check(std::vector<std::string> args, bool positional = false) {
  args.insert(args.begin(), "program");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  CommandLineRules rules;
  rules.program = "program";
  rules.positional = positional;
  rules.not_empty = {"mode"};
  const absl::Status status = CheckCommandLine(static_cast<int>(argv.size()), argv.data(), rules);
  return std::string(status.message());
}

TEST(CheckCommandLine, AcceptsWhatAbseilAccepts) {
  EXPECT_EQ(Check({"--count=3", "-count=4", "--count", "5", "--verbose", "--noverbose"}), "");
  EXPECT_EQ(Check({"--verbose=false", "--mode=a"}), "");
  EXPECT_EQ(Check({"--help"}), "");
  EXPECT_EQ(Check({"--helpfull"}), "");
  EXPECT_EQ(Check({"--version"}), "");
  EXPECT_EQ(absl::GetFlag(FLAGS_count), 5);  // the check sets what it reads
}

TEST(CheckCommandLine, EachErrorIsOneLineNamingTheFlag) {
  EXPECT_EQ(Check({"--no_such"}), "unknown flag --no_such (--help lists them)");
  EXPECT_EQ(Check({"--count"}), "--count needs a value");
  EXPECT_EQ(Check({"--count=abc"}).rfind("--count=abc: ", 0), 0u);
  EXPECT_EQ(Check({"--nocount"}), "unknown flag --nocount (--help lists them)");
  EXPECT_EQ(Check({"--mode="}), "--mode needs a value (it was given empty)");
  EXPECT_EQ(Check({"plan"}), "unexpected argument 'plan': program takes flags only");
  EXPECT_EQ(Check({"--", "x"}), "unexpected argument 'x': program takes flags only");
}

TEST(CheckCommandLine, PositionalArgumentsWhenTheProgramTakesThem) {
  EXPECT_EQ(Check({"plan", "--count=2"}, /*positional=*/true), "");
  EXPECT_EQ(Check({"plan", "--", "--not-a-flag"}, /*positional=*/true), "");
}

TEST(CheckCommandLine, UndefokLetsItsFlagsPass) {
  EXPECT_EQ(Check({"--undefok=later,other", "--later=1", "--nolater"}), "");
  EXPECT_EQ(Check({"--later=1", "--undefok=later"}), "");  // wherever it is given
  EXPECT_EQ(Check({"--undefok=later", "--other"}), "unknown flag --other (--help lists them)");
}

TEST(CheckCommandLine, FlagfilesAreReadAndChecked) {
  TempDir dir;
  const std::string good = dir.File("good");
  std::ofstream(good) << "# a comment\n\n  --count=7\n--verbose\n";
  EXPECT_EQ(Check({"--flagfile=" + good}), "");
  EXPECT_EQ(absl::GetFlag(FLAGS_count), 7);
  EXPECT_EQ(Check({"--flagfile", good}), "");

  const std::string missing = dir.File("missing");
  EXPECT_EQ(Check({"--flagfile=" + missing}), "--flagfile=" + missing + ": no such file");
  EXPECT_EQ(Check({"--flagfile=" + dir.path()}),
            "--flagfile=" + dir.path() + ": is a directory, not a file");
  EXPECT_EQ(Check({"--flagfile=" + good + "," + missing}),
            "--flagfile=" + missing + ": no such file");

  const std::string bad = dir.File("bad");
  std::ofstream(bad) << "--count=2\n--count=abc\n";
  EXPECT_EQ(Check({"--flagfile=" + bad}).rfind("--flagfile=" + bad + ": line 2: --count=abc: ", 0),
            0u);
  std::ofstream(bad) << "--count=2\ncount=3\n";
  EXPECT_EQ(Check({"--flagfile=" + bad}),
            "--flagfile=" + bad + ": line 2: 'count=3' is not a flag");
  // A flag at the end of a file does not take its value from the command line.
  std::ofstream(bad) << "--count\n";
  EXPECT_EQ(Check({"--flagfile=" + bad, "5"}),
            "--flagfile=" + bad + ": line 1: --count needs a value");
}

TEST(CheckCommandLine, NestedFlagfilesAndLoops) {
  TempDir dir;
  const std::string outer = dir.File("outer");
  const std::string inner = dir.File("inner");
  std::ofstream(outer) << "--flagfile=" << inner << "\n";
  std::ofstream(inner) << "--no_such=1\n";
  EXPECT_EQ(Check({"--flagfile=" + outer}),
            "--flagfile=" + inner + ": line 1: unknown flag --no_such (--help lists them)");
  std::ofstream(inner) << "--flagfile=" << outer << "\n";
  EXPECT_NE(Check({"--flagfile=" + outer}).find("nested more than 16 deep"), std::string::npos);
}

TEST(CheckCommandLine, FlagsFromTheEnvironment) {
  ASSERT_EQ(unsetenv("FLAGS_count"), 0);
  EXPECT_EQ(Check({"--fromenv=count"}), "--fromenv=count: FLAGS_count is not set");
  EXPECT_EQ(Check({"--tryfromenv=count"}), "");
  ASSERT_EQ(setenv("FLAGS_count", "x", 1), 0);
  EXPECT_EQ(Check({"--tryfromenv=count"}).rfind("--tryfromenv=count (FLAGS_count): --count=x: ", 0),
            0u);
  ASSERT_EQ(setenv("FLAGS_count", "9", 1), 0);
  EXPECT_EQ(Check({"--fromenv=count"}), "");
  EXPECT_EQ(absl::GetFlag(FLAGS_count), 9);
  ASSERT_EQ(unsetenv("FLAGS_count"), 0);
  EXPECT_EQ(Check({"--fromenv=flagfile"}), "--fromenv=flagfile: not a flag it can set");
}

}  // namespace
}  // namespace packsched
