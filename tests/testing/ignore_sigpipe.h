#ifndef PACKSCHED_TESTS_TESTING_IGNORE_SIGPIPE_H_
#define PACKSCHED_TESTS_TESTING_IGNORE_SIGPIPE_H_

// Gloo writes to its sockets without MSG_NOSIGNAL, so a rank that writes to a peer that has gone
// (a test's dead rank) gets SIGPIPE, whose default action kills the whole test process (every
// rank is a thread of it). packsched-server ignores SIGPIPE (main.cc) so that the write fails
// with EPIPE and the round with Aborted; tests that include this do the same, at start-up.

#include <csignal>

namespace packsched::testing {

inline const bool kSigpipeIgnored = std::signal(SIGPIPE, SIG_IGN) != SIG_ERR;

}  // namespace packsched::testing

#endif  // PACKSCHED_TESTS_TESTING_IGNORE_SIGPIPE_H_
