// A rank 0 stalled for seconds does not fail its peers' store calls (rendezvous.h): rank 0's
// store server runs in a child process that the test stops (SIGSTOP) for longer than the
// channel's keepalive allows; a Get made meanwhile, whose connection the channel drops on the
// missed pings, is made again and answered once rank 0 runs again, within its deadline.
//
// Its own binary: the child is forked before this process has used gRPC.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"
#include "server/service/rendezvous.h"

namespace packsched::service {
namespace {

// Forks a child serving an in-memory store on a loopback port; returns its pid and port.
std::pair<pid_t, int> ForkStoreServer() {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {-1, 0};
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    collective::InMemoryStore store;
    RendezvousServerOptions options;
    options.listen = "127.0.0.1:0";
    absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
        RendezvousServer::Start(&store, options);
    const int port = server.ok() ? (*server)->port() : 0;
    if (write(pipe_fds[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    for (;;) pause();  // killed by the test
  }
  close(pipe_fds[1]);
  int port = 0;
  if (read(pipe_fds[0], &port, sizeof(port)) != sizeof(port)) port = 0;
  close(pipe_fds[0]);
  return {pid, port};
}

TEST(RendezvousStall, AGetThroughAStalledRankZeroIsAnsweredWhenItRunsAgain) {
  const auto [pid, port] = ForkStoreServer();
  ASSERT_GT(pid, 0);
  ASSERT_GT(port, 0);
  RendezvousClientOptions options;
  options.address = absl::StrCat("127.0.0.1:", port);
  absl::StatusOr<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v", absl::Now() + absl::Seconds(10)).ok());

  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  // kill() only queues the stop: wait until every thread of rank 0 has stopped.
  int wait_status = 0;
  ASSERT_EQ(waitpid(pid, &wait_status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(wait_status));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  absl::Duration took;
  std::thread reader([&] {
    got = (*store)->Get("k", absl::Now() + absl::Seconds(20));
    took = absl::Now() - start;
  });
  // Past two keepalive periods: the channel has dropped the connection to the stalled rank 0.
  absl::SleepFor(absl::Seconds(4));
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  reader.join();
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_GE(took, absl::Seconds(3));  // it was answered after the stall, not before
}

}  // namespace
}  // namespace packsched::service
