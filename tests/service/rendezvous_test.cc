#include "server/service/rendezvous.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/collective/store.h"

namespace packsched::service {
namespace {

using ::testing::HasSubstr;

struct Served {
  collective::InMemoryStore store;
  std::unique_ptr<RendezvousServer> server;
  std::string address;
};

std::unique_ptr<Served> Serve(std::string token = "", std::string listen = "127.0.0.1:0") {
  auto served = std::make_unique<Served>();
  RendezvousServerOptions options;
  options.listen = std::move(listen);
  options.auth_token = std::move(token);
  absl::StatusOr<std::unique_ptr<RendezvousServer>> server =
      RendezvousServer::Start(&served->store, options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  served->server = *std::move(server);
  served->address = absl::StrCat("127.0.0.1:", served->server->port());
  return served;
}

std::unique_ptr<RendezvousStore> Connect(const std::string& address, std::string token = "") {
  RendezvousClientOptions options;
  options.address = address;
  options.auth_token = std::move(token);
  absl::StatusOr<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Create(options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

absl::Time In(absl::Duration d) { return absl::Now() + d; }

TEST(Rendezvous, EveryOperationReachesTheServedStore) {
  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto client = Connect(served->address);
  ASSERT_NE(client, nullptr);
  const absl::Time deadline = In(absl::Seconds(5));

  ASSERT_TRUE(client->Set("a/1", "one", deadline).ok());
  EXPECT_EQ(*served->store.TryGet("a/1", deadline), std::optional<std::string>("one"));
  EXPECT_EQ(*client->Get("a/1", deadline), "one");
  EXPECT_EQ(*client->TryGet("a/1", deadline), std::optional<std::string>("one"));
  EXPECT_EQ(*client->TryGet("a/2", deadline), std::nullopt);

  // Compare-and-set: create if absent, then only from the expected value.
  EXPECT_EQ(*client->CompareAndSet("gen", std::nullopt, "0", deadline), "0");
  EXPECT_EQ(*client->CompareAndSet("gen", std::nullopt, "5", deadline), "0");
  EXPECT_EQ(*client->CompareAndSet("gen", "0", "1", deadline), "1");
  EXPECT_EQ(*client->CompareAndSet("gen", "0", "2", deadline), "1");
  EXPECT_EQ(*client->CompareAndSet("none", "x", "y", deadline), "");

  ASSERT_TRUE(client->Set("a/2", "two", deadline).ok());
  ASSERT_TRUE(client->Set("b/1", "other", deadline).ok());
  EXPECT_EQ(*client->DeletePrefix("a/", deadline), 2);
  EXPECT_EQ(*client->TryGet("a/1", deadline), std::nullopt);
  EXPECT_EQ(*client->TryGet("b/1", deadline), std::optional<std::string>("other"));
  // Binary keys and values pass through unchanged.
  const std::string bytes("\0\xff\x01", 3);
  ASSERT_TRUE(client->Set(bytes, bytes, deadline).ok());
  EXPECT_EQ(*client->Get(bytes, deadline), bytes);
}

TEST(Rendezvous, AGetWaitsForAnotherClientsSet) {
  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto waiter = Connect(served->address);
  auto setter = Connect(served->address);
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(setter->Set("late", "here", In(absl::Seconds(5))).ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = waiter->Get("late", In(absl::Seconds(5)));
  later.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
}

TEST(Rendezvous, ManyConcurrentGetsForMissingKeysEndAtTheirDeadline) {
  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto client = Connect(served->address);
  // More concurrent waiting Gets than a thread-per-call server would comfortably hold.
  constexpr int kWaiters = 200;
  std::vector<std::thread> threads;
  std::vector<absl::Status> statuses(kWaiters);
  const absl::Time start = absl::Now();
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      statuses[i] = client->Get(absl::StrCat("never/", i), In(absl::Milliseconds(400))).status();
    });
  }
  for (std::thread& t : threads) t.join();
  const absl::Duration took = absl::Now() - start;
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  }
  EXPECT_THAT(statuses[7].message(), HasSubstr("never/7"));
  EXPECT_LT(took, absl::Seconds(3));
  // Every watch was cancelled: a later Set of a waited key finds no stale watcher.
  ASSERT_TRUE(client->Set("never/3", "x", In(absl::Seconds(5))).ok());
  EXPECT_EQ(served->store.size(), 1);
}

TEST(Rendezvous, AClientStartedBeforeTheServerConnectsQuickly) {
  // Pick a free port, then serve on it only after the client has started waiting.
  int port = 0;
  {
    auto probe = Serve();
    ASSERT_NE(probe, nullptr);
    port = probe->server->port();
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto client = Connect(address);
  absl::StatusOr<std::string> value;
  absl::Time got;
  std::thread waiter([&] {
    value = client->Get("ready", In(absl::Seconds(10)));
    got = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(1500));  // the client's backoff has grown by now
  auto served = Serve("", address);
  ASSERT_NE(served, nullptr);
  const absl::Time set_at = absl::Now();
  ASSERT_TRUE(served->store.Set("ready", "yes", absl::InfiniteFuture()).ok());
  waiter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  // Backoff is capped at 500 ms (gRPC's default would be seconds by now).
  EXPECT_LT(got - set_at, absl::Milliseconds(900));
}

// How a rank notices that rank 0 died (and may have restarted under a new epoch) without
// polling it: the channel's connection drops, seen at once and with no request.
TEST(Rendezvous, AServerThatGoesAwayIsSeenThroughTheConnectionAtOnce) {
  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto client = Connect(served->address);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("up", "1", In(absl::Seconds(5))).ok());  // connected

  absl::StatusOr<bool> quiet = client->AwaitDisconnect(In(absl::Milliseconds(200)));
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  EXPECT_FALSE(*quiet);  // nothing happened: the deadline

  absl::Time seen = absl::InfiniteFuture();
  std::thread watcher([&] {
    const absl::Time give_up = In(absl::Seconds(5));
    while (absl::Now() < give_up) {
      absl::StatusOr<bool> dropped = client->AwaitDisconnect(In(absl::Milliseconds(200)));
      if (dropped.ok() && *dropped) {
        seen = absl::Now();
        return;
      }
    }
  });
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time gone = absl::Now();
  served->server->Shutdown();
  watcher.join();
  EXPECT_LT(seen - gone, absl::Milliseconds(500)) << "not seen";

  collective::InMemoryStore memory;
  EXPECT_EQ(memory.AwaitDisconnect(In(absl::Seconds(1))).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(Rendezvous, TheBearerTokenIsRequired) {
  auto served = Serve("s3cret");
  ASSERT_NE(served, nullptr);
  auto good = Connect(served->address, "s3cret");
  auto bad = Connect(served->address, "wrong");
  auto none = Connect(served->address);
  const absl::Time deadline = In(absl::Seconds(5));
  EXPECT_TRUE(good->Set("k", "v", deadline).ok());
  EXPECT_EQ(bad->Get("k", deadline).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(none->TryGet("k", deadline).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none->Set("k", "v", deadline).message(), HasSubstr(served->address));
}

TEST(Rendezvous, ATokenWithoutTlsIsRefusedOffLoopback) {
  collective::InMemoryStore store;
  RendezvousServerOptions options;
  options.listen = "0.0.0.0:0";
  options.auth_token = "t";
  EXPECT_EQ(RendezvousServer::Start(&store, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  RendezvousClientOptions client;
  client.address = "10.1.2.3:29400";
  client.auth_token = "t";
  EXPECT_EQ(RendezvousStore::Create(client).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Rendezvous, AnUnreachableServerIsADeadlineNotAHang) {
  auto client = Connect("127.0.0.1:1");
  const absl::Time start = absl::Now();
  absl::Status status = client->Set("k", "v", In(absl::Milliseconds(300)));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// Shutdown's way out of a group formation: a Get blocked on a key nobody sets ends at Cancel(),
// long before its deadline, and every later call is refused at once.
TEST(Rendezvous, CancelEndsABlockedGetAndRefusesLaterCalls) {
  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto client = Connect(served->address);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("up", "1", In(absl::Seconds(5))).ok());  // connected
  absl::StatusOr<std::string> blocked = std::string("not returned");
  std::thread getter([&] { blocked = client->Get("never-set", In(absl::Seconds(60))); });
  // Until the server holds the Get (a watch on the key); a Cancel() before the call starts is
  // refused the same way, so this only makes the test cover the call in progress.
  absl::SleepFor(absl::Milliseconds(100));
  client->Cancel();
  getter.join();
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kCancelled) << blocked.status();
  EXPECT_THAT(blocked.status().message(), HasSubstr("shutting down"));
  const absl::Status later = client->Set("k", "v", In(absl::Seconds(5)));
  EXPECT_EQ(later.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(served->store.TryGet("k", In(absl::Seconds(5)))->has_value(), false);
  client->Cancel();  // idempotent
  EXPECT_EQ(client->FailFast().Set("k", "v", In(absl::Seconds(5))).code(),
            absl::StatusCode::kCancelled);  // the fail-fast view is cancelled with the store
}

// The view used to explain a failed round: a dead rank 0 fails at once instead of being waited
// for until the deadline, and a live one is the same store.
TEST(Rendezvous, TheFailFastViewDoesNotWaitForAnUnreachableServer) {
  auto client = Connect("127.0.0.1:1");
  const absl::Time start = absl::Now();
  absl::Status status = client->FailFast().Set("k", "v", In(absl::Seconds(5)));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto live = Connect(served->address);
  ASSERT_TRUE(live->Set("k", "v", In(absl::Seconds(5))).ok());
  absl::StatusOr<std::optional<std::string>> value =
      live->FailFast().TryGet("k", In(absl::Seconds(5)));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST(Rendezvous, LocalAddressTowardsLoopbackIsLoopback) {
  absl::StatusOr<std::string> local = LocalAddressTowards("127.0.0.1:29400");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
  EXPECT_FALSE(LocalAddressTowards("no-such-host.invalid:1").ok());
}

// A body that is not the method's request message: INVALID_ARGUMENT naming the message, on
// every method (gRPC's own refusal was UNIMPLEMENTED with no message).
TEST(Rendezvous, AnUnparseableBodyIsInvalidArgumentNamingTheMessage) {
  auto served = Serve();
  ASSERT_NE(served, nullptr);
  auto channel = grpc::CreateChannel(served->address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const std::pair<const char*, const char*> methods[] = {
      {"Set", "RendezvousSetRequest"},
      {"Get", "RendezvousGetRequest"},
      {"TryGet", "RendezvousGetRequest"},
      {"CompareAndSet", "RendezvousCompareAndSetRequest"},
      {"DeletePrefix", "RendezvousDeletePrefixRequest"},
  };
  for (const auto& [method, message] : methods) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(In(absl::Seconds(10))));
    grpc::Slice garbage(std::string("\xff\xff\xff\xff", 4));  // a truncated varint tag
    grpc::ByteBuffer request(&garbage, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, absl::StrCat("/packsched.v1.Rendezvous/", method), grpc::StubOptions(),
                   &request, &response, [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat("packsched.v1.", message)))
        << method;
  }
  // The store still answers well-formed calls.
  auto client = Connect(served->address);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Set("k", "v", In(absl::Seconds(5))).ok());
}

}  // namespace
}  // namespace packsched::service
