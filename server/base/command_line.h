#ifndef PACKSCHED_SERVER_BASE_COMMAND_LINE_H_
#define PACKSCHED_SERVER_BASE_COMMAND_LINE_H_

// A command line checked the way Abseil's flag parser reads it, before that parser runs: it
// exits with status 1 on any error (an unknown flag, a value that does not parse, a missing
// --flagfile), where packsched's programs promise status 2 and one line naming the flag. Used by
// packsched-server (server/sidecar/command_line.h) and `packsched plan` (server/cli/main.cc).
//
// Read as Abseil reads it: "-x" or "--x", "--x=v", "--x v" for a flag that is not a bool,
// "--nox" for a bool one, "--" ends the flags; --flagfile=F[,G] reads flags from files (one per
// line, leading blanks and lines starting with '#' ignored, nested flagfiles followed);
// --fromenv=a[,b] and --tryfromenv take FLAGS_a from the environment; --undefok=a[,b] lets
// those unknown flags pass. Abseil's help flags (--help, --helpfull, --version, ...) pass.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace packsched {

struct CommandLineRules {
  // The program, as its messages name it ("packsched-server takes flags only").
  std::string program;
  // Whether arguments that are not flags are allowed (a command such as `plan`); they are left
  // to the program.
  bool positional = false;
  // Flags that select a mode and mean nothing when given empty.
  std::vector<std::string> not_empty;
};

// Returns OK, or InvalidArgument with one line (no newline) for the first error: "unknown flag
// --x (--help lists them)", "--x needs a value", "--x=v: <why it does not parse>", "--x needs a
// value (it was given empty)" (a flag of rules.not_empty), "unexpected argument 'a': <program>
// takes flags only", "--flagfile=F: <why the file cannot be read>", "--flagfile=F: line N: ..."
// for an error inside it, "--fromenv=a: FLAGS_a is not set". Sets the flags it reads (the
// parser then sets them again, to the same values).
absl::Status CheckCommandLine(int argc, char** argv, const CommandLineRules& rules);

// Runs Abseil's parser over a command line that CheckCommandLine accepted, leaving Abseil's help
// flags to the program (Abseil itself would exit 1 after them). Returns the arguments that are
// not flags (argv[0] first), or std::nullopt once the help a help flag asked for (--help,
// --helpfull, --version, ...) is printed on stdout: the program then exits 0.
std::optional<std::vector<char*>> ParseCheckedCommandLine(int argc, char** argv);

}  // namespace packsched

#endif  // PACKSCHED_SERVER_BASE_COMMAND_LINE_H_
