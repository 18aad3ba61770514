#ifndef PACKSCHED_SERVER_SIDECAR_COMMAND_LINE_H_
#define PACKSCHED_SERVER_SIDECAR_COMMAND_LINE_H_

// packsched-server's command line, with the exit codes docs/operating.md states: --help (and
// absl's other help flags) and --version print and exit 0; a usage error — an unknown flag, a
// value that does not parse, a flag without its value, an argument that is not a flag, an empty
// --status= or --probe= — prints one line on stderr and exits 2.

#include <optional>
#include <string>

namespace packsched::sidecar {

inline constexpr int kUsageError = 2;

// "packsched-server VERSION (commit COMMIT)": COMMIT is the git commit CMake saw at configure
// time, "unknown" outside a git checkout.
std::string VersionLine();

// Sets the program's usage message and version, then parses argv into the flags. Returns the
// exit code when the process should exit now (0 after --help or --version, kUsageError after a
// usage error, with its message printed), nullopt to go on.
std::optional<int> ParseCommandLine(int argc, char** argv);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_COMMAND_LINE_H_
