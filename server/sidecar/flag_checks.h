#ifndef PACKSCHED_SERVER_SIDECAR_FLAG_CHECKS_H_
#define PACKSCHED_SERVER_SIDECAR_FLAG_CHECKS_H_

// Every flag of packsched-server checked in one pass, before anything is started or written
// (server/main.cc runs it right after parsing): ranges (ports, threads, queues, limits, world
// size and rank), files (they exist, are regular files, can be read and hold what their flag
// says: a token, a certificate and its key), the network interface and address Gloo will use,
// and the flags that need one another. One row per flag (flag_checks.cc); the checks of one
// kind are the functions below, which read no flag and can be tested alone.
//
// Every error is InvalidArgument with one line, "--flag=value: rule" (the flag at fault, its
// value as given, and the rule it breaks): the server prints it after "packsched-server: " and
// exits 2 (docs/operating.md, "Exit status").

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace packsched::sidecar {

// The most threads a thread-count flag may ask for (--planning_threads, --max_threads).
inline constexpr int64_t kMaxFlagThreads = 1024;

// Checks every flag's current value, row by row in the order of flags.cc; returns the first
// error, or OK. Reads the files and the interfaces the flags name and binds (then closes) one
// socket for --gloo_hostname; writes nothing. REQUIRES: the command line has been parsed.
absl::Status CheckFlags();

// The flags CheckFlags has a row for, without dashes (the test that every flag has bad values
// compares them with --helpfull).
std::vector<std::string> CheckedFlags();

// ---- Checks of one kind: each returns OK or "--<flag>=<value>: <rule>" -----------------------

// `value` in [lo, hi]: "must be lo..hi".
absl::Status CheckRange(absl::string_view flag, int64_t value, int64_t lo, int64_t hi);

// `value` in [lo, hi], finite: "must be lo..hi" (absl's duration syntax).
absl::Status CheckDurationRange(absl::string_view flag, absl::Duration value, absl::Duration lo,
                                absl::Duration hi);

// A HOST:PORT or [V6]:PORT with PORT in [min_port, 65535] (host_port.h); with `allow_unix`, also a
// "unix:" or "unix-abstract:" socket, as gRPC takes them. Empty is refused: callers skip
// flags left empty.
absl::Status CheckAddress(absl::string_view flag, absl::string_view value, int min_port,
                          bool allow_unix = false);

// A file this process can read (file_check.h); with `not_blank`, holding more than whitespace.
absl::Status CheckReadable(absl::string_view flag, absl::string_view path, bool not_blank = false);

// A place a file can be written (file_check.h: CheckWritablePath).
absl::Status CheckWritable(absl::string_view flag, absl::string_view path);

// A count of threads made at start (--planning_threads) in [lo, kMaxFlagThreads], and below
// ThreadLimit() (machine_checks.h) when one is set, so that they can be created.
absl::Status CheckThreads(absl::string_view flag, int64_t value, int64_t lo);

// A TLS server name: a DNS name (letters, digits, '-', '.', labels of 1..63) or an IP address.
absl::Status CheckServerName(absl::string_view flag, absl::string_view value);

}  // namespace packsched::sidecar

#endif  // PACKSCHED_SERVER_SIDECAR_FLAG_CHECKS_H_
