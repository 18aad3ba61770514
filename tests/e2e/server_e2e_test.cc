// End to end: the real packsched-server binary on loopback (port 0 + --port_file) and the C++
// client — plans, errors, limits, the bearer token, TLS, health, GetStatus and SIGTERM.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/cpp/plan_apply.h"
#include "client/cpp/scheduler_client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/planner/planner.h"
#include "server/planner/tree_plan.h"
#include "tests/e2e/server_process.h"
#include "tests/testing/lengths.h"

namespace packsched {
namespace {

using ::packsched::client::ClientOptions;
using ::packsched::client::PlanRequest;
using ::packsched::client::PlanResult;
using ::packsched::client::SchedulerClient;
using ::packsched::testing::FreePort;
using ::packsched::testing::ReadAll;
using ::packsched::testing::ServerProcess;
using ::packsched::testing::TempDir;
using ::testing::HasSubstr;

constexpr int64_t kCap = 18432;

std::unique_ptr<SchedulerClient> Connect(const std::string& target, ClientOptions options = {}) {
  options.target = target;
  options.timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<SchedulerClient>> client = SchedulerClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

PlanRequest Request(const std::string& stream, int64_t round, uint64_t seed, int64_t n = 512) {
  PlanRequest request;
  request.stream = stream;
  request.round = round;
  request.lengths = testing::RealisticRlLengths(n, seed);
  request.options.max_token_len = kCap;
  return request;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

TEST(ServerE2E, PortFileHoldsOneLineWithThePort) {
  ServerProcess server({});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  EXPECT_EQ(server.port_file_contents(), absl::StrCat(server.port(), "\n"));
}

TEST(ServerE2E, PlanMatchesThePlannerAndCarriesLossWeights) {
  ServerProcess server({});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());
  PlanRequest request = Request("actor_update", 1, 1);
  for (int64_t length : request.lengths) request.loss_tokens.push_back(length / 3);
  const absl::StatusOr<PlanResult> plan = client->Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();

  const absl::StatusOr<planner::MicroBatchPlan> alone =
      planner::PlanMicroBatches(request.lengths, request.options);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(plan->num_micro_batches, static_cast<int64_t>(alone->parts.size()));
  EXPECT_EQ(plan->local_num_micro_batches, plan->num_micro_batches);
  EXPECT_EQ(plan->plan.reorder, alone->reorder);
  EXPECT_EQ(plan->plan.revert, alone->revert);
  ASSERT_EQ(plan->plan.parts.size(), alone->parts.size());
  for (size_t m = 0; m < alone->parts.size(); ++m) {
    EXPECT_EQ(plan->plan.parts[m].indices, alone->parts[m].indices);
    EXPECT_EQ(plan->plan.parts[m].cu_seqlens, alone->parts[m].cu_seqlens);
    EXPECT_EQ(plan->plan.parts[m].max_seqlen, alone->parts[m].max_seqlen);
    EXPECT_LE(plan->plan.parts[m].total, kCap);
  }
  int64_t loss_tokens = 0;
  for (int64_t t : request.loss_tokens) loss_tokens += t;
  EXPECT_EQ(plan->global.loss_tokens, loss_tokens);
  EXPECT_EQ(plan->global.world_size, 1);
  ASSERT_EQ(plan->loss_weights.size(), request.lengths.size());
  EXPECT_DOUBLE_EQ(plan->loss_weights[0], 1.0 / static_cast<double>(loss_tokens));
  ASSERT_EQ(plan->loss_scales.size(), alone->parts.size());
  EXPECT_DOUBLE_EQ(plan->loss_scales[0], 1.0 / static_cast<double>(loss_tokens));

  // The helpers put rows in plan order and back.
  const auto planned = client::ApplyReorder(request.lengths, plan->plan.reorder);
  ASSERT_TRUE(planned.ok());
  const auto restored = client::RestoreOrder(*planned, plan->plan.revert);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(*restored, request.lengths);
}

// Tree packing: a forest through the C++ client plans as the planner alone does, with its layout.
TEST(ServerE2E, ForestPlansWithItsLayout) {
  ServerProcess server({});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());
  PlanRequest request;
  request.stream = "trees";
  request.round = 1;
  request.options.max_token_len = 4096;
  request.forest =
      planner::Forest{{1000, 100, 200, 300, 800, 50}, {-1, 0, 0, 0, -1, 4}, {1, 2, 3, 5}, {}};
  request.loss_tokens = {100, 200, 300, 50};
  const absl::StatusOr<PlanResult> plan = client->Plan(request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const absl::StatusOr<planner::TreePlan> alone =
      planner::PlanForest(*request.forest, request.options);
  ASSERT_TRUE(alone.ok());
  ASSERT_TRUE(plan->tree.has_value());
  ASSERT_EQ(plan->tree->parts.size(), alone->parts.size());
  for (size_t m = 0; m < alone->parts.size(); ++m) {
    const planner::TreeEntries got = planner::Entries(plan->tree->parts[m], *request.forest);
    const planner::TreeEntries want = planner::Entries(alone->parts[m], *request.forest);
    EXPECT_EQ(got.nodes, want.nodes);
    EXPECT_EQ(got.subtree_end, want.subtree_end);
    EXPECT_EQ(plan->tree->parts[m].layout.piece_rollouts, alone->parts[m].layout.piece_rollouts);
    EXPECT_EQ(plan->tree->parts[m].batch.cu_seqlens, alone->parts[m].batch.cu_seqlens);
  }
  EXPECT_EQ(plan->tree->forwarded_tokens, 2450);
  ASSERT_EQ(plan->loss_weights.size(), 4u);
  EXPECT_DOUBLE_EQ(plan->loss_weights[0], 1.0 / 650);

  request.round = 2;
  request.forest->node_parent[2] = 9;
  const absl::StatusOr<PlanResult> bad = client->Plan(request);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("node 2 has node_parent = 9"));
}

TEST(ServerE2E, ModelParallelCallersOfOneRoundGetOnePlan) {
  ServerProcess server({});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());
  const PlanRequest request = Request("actor_update", 77, 2, 2048);
  std::vector<absl::StatusOr<PlanResult>> results(4, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  for (int tp = 0; tp < 4; ++tp) {
    callers.emplace_back([&, tp] { results[tp] = client->Plan(request); });
  }
  for (std::thread& t : callers) t.join();
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->plan.reorder, results[0]->plan.reorder);
    EXPECT_EQ(result->num_micro_batches, results[0]->num_micro_batches);
    EXPECT_EQ(result->local_time, results[0]->local_time);  // the same computation
  }
  const absl::StatusOr<client::ServerStatus> status = client->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->rounds, 1);
  EXPECT_EQ(status->cache_hits + status->joined_in_flight, 3);
}

TEST(ServerE2E, ErrorsNameTheFieldAndAreNotRetried) {
  ServerProcess server({"--max_sequences_per_request=1000", "--max_receive_message_bytes=65536"});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());

  PlanRequest bad = Request("s", 1, 3, 16);
  bad.lengths[5] = -2;
  absl::StatusOr<PlanResult> result = client->Plan(bad);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("lengths[5] = -2"));

  PlanRequest zero_cap = Request("s", 2, 3, 16);
  zero_cap.options.max_token_len = 0;
  EXPECT_THAT(client->Plan(zero_cap).status().message(), HasSubstr("options.max_token_len = 0"));

  ASSERT_TRUE(client->Plan(Request("s", 3, 4, 16)).ok());
  result = client->Plan(Request("s", 3, 5, 16));  // same round, different lengths
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);

  result = client->Plan(Request("s", 4, 6, 1001));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(result.status().message(), HasSubstr("--max_sequences_per_request = 1000"));

  PlanRequest huge = Request("s", 5, 7, 16);
  huge.lengths.assign(40000, 100000);  // about 120 KiB on the wire: over the 64 KiB limit
  huge.loss_tokens.assign(40000, 50);
  EXPECT_EQ(client->Plan(huge).status().code(), absl::StatusCode::kResourceExhausted);

  const absl::StatusOr<client::ServerStatus> status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  // Each failed call was answered once: the client retried none of them.
  EXPECT_EQ(status->errors_by_code.at("INVALID_ARGUMENT"), 2);
  EXPECT_EQ(status->errors_by_code.at("FAILED_PRECONDITION"), 1);
  EXPECT_EQ(status->errors_by_code.at("RESOURCE_EXHAUSTED"), 1);  // the other is gRPC's own
}

// Regression: invalid requests used to create streams that were never reclaimed, so two of them
// locked out every new stream under --max_streams=2. They create nothing now, and idle streams
// are reclaimed (GetStatus lists live streams only).
TEST(ServerE2E, InvalidRequestsTakeNoStreamSlotAndIdleStreamsAreReclaimed) {
  ServerProcess server({"--max_streams=2", "--stream_idle_timeout=1s"});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());
  for (const char* stream : {"bad1", "bad2", "bad3"}) {
    PlanRequest bad = Request(stream, 1, 3, 16);
    bad.lengths[2] = 0;
    EXPECT_EQ(client->Plan(bad).status().code(), absl::StatusCode::kInvalidArgument) << stream;
  }
  ASSERT_TRUE(client->Plan(Request("a", 1, 1, 16)).ok());
  ASSERT_TRUE(client->Plan(Request("b", 1, 2, 16)).ok());
  absl::StatusOr<client::ServerStatus> status = client->GetStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->streams.size(), 2u);
  // Both idle streams go, and their slots with them.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (status.ok() && !status->streams.empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    status = client->GetStatus();
  }
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->streams.empty());
  EXPECT_TRUE(client->Plan(Request("c", 1, 4, 16)).ok());
  // A served round of a reclaimed stream is not run again.
  EXPECT_EQ(client->Plan(Request("a", 1, 1, 16)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(client->Plan(Request("a", 2, 1, 16)).ok());
}

TEST(ServerE2E, PartitionAndBalanceBatch) {
  ServerProcess server({});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());
  client::PartitionRequest partition;
  partition.lengths = testing::RealisticRlLengths(300, 8);
  partition.options.max_token_len = kCap;
  partition.num_micro_batches = 64;
  const absl::StatusOr<PlanResult> parts = client->Partition(partition);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->plan.parts.size(), 64u);

  client::BalanceBatchRequest balance;
  balance.lengths = testing::RealisticRlLengths(1024, 9);
  balance.world_size = 8;
  balance.options.max_token_len = kCap;
  const absl::StatusOr<client::BalancedPlan> balanced = client->BalanceBatch(balance);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  ASSERT_EQ(balanced->ranks.size(), 8u);
  for (const client::RankPlan& rank : balanced->ranks) {
    EXPECT_EQ(rank.indices.size(), 128u);
    EXPECT_EQ(static_cast<int64_t>(rank.plan.plan.parts.size()), balanced->num_micro_batches);
  }

  // sync = micro_batch: the sidecar's step is the planner's.
  balance.balance = planner::BalanceOptions{planner::Sync::kMicroBatch, 1000};
  const absl::StatusOr<client::BalancedPlan> slots = client->BalanceBatch(balance);
  ASSERT_TRUE(slots.ok()) << slots.status();
  const absl::StatusOr<planner::BalancedBatch> local = planner::BalanceBatch(
      balance.lengths, balance.world_size, balance.options, {}, balance.balance);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(slots->num_micro_batches, local->num_micro_batches);
  EXPECT_EQ(slots->step.micro_batch_sync_cost, local->step.micro_batch_sync_cost);
  EXPECT_EQ(slots->step.lower_bound, local->step.lower_bound);
}

TEST(ServerE2E, BearerToken) {
  TempDir dir;
  WriteFile(dir.File("token"), "s3cret-token\n");
  ServerProcess server({absl::StrCat("--auth_token_file=", dir.File("token"))});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  EXPECT_EQ(Connect(server.target())->Plan(Request("s", 1, 1)).status().code(),
            absl::StatusCode::kUnauthenticated);
  ClientOptions wrong;
  wrong.auth_token = "s3cret-tokem";
  EXPECT_EQ(Connect(server.target(), wrong)->GetStatus().status().code(),
            absl::StatusCode::kUnauthenticated);
  ClientOptions right;
  right.auth_token = "s3cret-token";
  EXPECT_TRUE(Connect(server.target(), right)->Plan(Request("s", 1, 1)).ok());
}

TEST(ServerE2E, RefusesATokenWithoutTlsOffLoopback) {
  TempDir dir;
  WriteFile(dir.File("token"), "t");
  ServerProcess server(
      {"--listen=0.0.0.0:0", absl::StrCat("--auth_token_file=", dir.File("token"))});
  EXPECT_FALSE(server.started());
  ASSERT_TRUE(server.Exited(absl::Seconds(10)));
  EXPECT_NE(*server.exit_status(), 0);
  EXPECT_THAT(server.stderr_text(), HasSubstr("only over TLS or on loopback"));
}

TEST(ServerE2E, DefaultOptionsWorkUnderALowerServerLimit) {
  // The planner's default max_micro_batches (1,000,000) is "no limit of the caller's own": the
  // client leaves it to the sidecar's --max_micro_batches instead of sending it.
  ServerProcess server({"--max_micro_batches=1000"});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  std::unique_ptr<SchedulerClient> client = Connect(server.target());
  const absl::StatusOr<PlanResult> plan = client->Plan(Request("s", 1, 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  client::PartitionRequest partition;
  partition.lengths = {5, 6, 7};
  partition.num_micro_batches = 2;
  const absl::StatusOr<PlanResult> parts = client->Partition(partition);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->plan.parts.size(), 2u);
  // An explicit value above the server's limit is still the caller's and is refused.
  PlanRequest over = Request("s", 2, 1);
  over.options.max_micro_batches = 1001;
  EXPECT_EQ(client->Plan(over).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ServerE2E, ClientRefusesACertificateWithoutTls) {
  ClientOptions options;
  options.tls_client_cert_file = "/nonexistent/client.pem";
  const auto client = SchedulerClient::Create(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("tls_root_certs_file"));
}

TEST(ServerE2E, ClientSendsATokenOnlyOverTlsOrToLoopback) {
  ClientOptions options;
  options.auth_token = "t";
  options.target = "10.0.0.7:50051";
  const auto remote = SchedulerClient::Create(options);
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(remote.status().message()), HasSubstr("10.0.0.7:50051"));
  options.target = "dns:///localhost:50051";
  EXPECT_TRUE(SchedulerClient::Create(options).ok());
  options.target = "10.0.0.7:50051";
  options.auth_token.clear();
  EXPECT_TRUE(SchedulerClient::Create(options).ok());  // nothing secret to send
}

TEST(ServerE2E, TlsWithClientCertificatesAndToken) {
  TempDir dir;
  const std::string d = dir.path();
  // A CA, a server certificate for localhost and a client certificate, all signed by the CA.
  const std::string script = absl::StrCat(
      "cd '", d, "' && ",
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key "
      "-out ca.pem -days 1 "
      "-subj /CN=packsched-test-ca && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key -out "
      "server.csr "
      "-subj /CN=localhost && ",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
      "-days 1 -extfile san.ext && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout client.key -out "
      "client.csr -subj /CN=client && ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
      "-days 1",
      " > openssl.log 2>&1");
  if (std::system(script.c_str()) != 0) GTEST_SKIP() << "openssl could not make certificates";
  WriteFile(dir.File("token"), "tls-token");
  ServerProcess server({"--listen=0.0.0.0:0", absl::StrCat("--tls_cert=", d, "/server.pem"),
                        absl::StrCat("--tls_key=", d, "/server.key"),
                        absl::StrCat("--tls_client_ca=", d, "/ca.pem"),
                        absl::StrCat("--auth_token_file=", dir.File("token"))});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  const std::string target = absl::StrCat("localhost:", server.port());
  ClientOptions tls;
  tls.tls_root_certs_file = d + "/ca.pem";
  tls.tls_client_cert_file = d + "/client.pem";
  tls.tls_client_key_file = d + "/client.key";
  tls.auth_token = "tls-token";
  tls.max_attempts = 1;
  EXPECT_TRUE(Connect(target, tls)->Plan(Request("s", 1, 1)).ok());
  ClientOptions no_client_cert = tls;
  no_client_cert.tls_client_cert_file.clear();
  no_client_cert.tls_client_key_file.clear();
  EXPECT_FALSE(Connect(target, no_client_cert)->GetStatus(absl::Seconds(1)).ok());
  ClientOptions plaintext;
  plaintext.auth_token = "tls-token";
  plaintext.max_attempts = 1;
  EXPECT_FALSE(Connect(target, plaintext)->GetStatus(absl::Seconds(1)).ok());

  // The exec probe, given the server's own TLS flags, speaks TLS (verifying the server against
  // --tls_client_ca, the one CA here, and presenting server.pem as its client certificate).
  const std::string probe_log = dir.File("probe.log");
  auto probe = [&](const std::string& flags) {
    return std::system(absl::StrCat(PACKSCHED_SERVER_PATH, " --probe=127.0.0.1:", server.port(),
                                    " ", flags, " 2>>'", probe_log, "'")
                           .c_str());
  };
  const std::string server_tls = absl::StrCat("--tls_cert=", d, "/server.pem --tls_key=", d,
                                              "/server.key --tls_client_ca=", d, "/ca.pem");
  EXPECT_EQ(probe(server_tls), 0) << ReadAll(probe_log);
  EXPECT_EQ(probe(server_tls + " --probe_tls_server_name=localhost"), 0) << ReadAll(probe_log);
  EXPECT_NE(probe(server_tls + " --probe_tls_server_name=elsewhere"), 0);  // name checked
  EXPECT_NE(probe(""), 0);                                                 // plaintext against TLS
}

TEST(ServerE2E, HealthAndStatus) {
  ServerProcess server({});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto channel = grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);  // HealthCheckRequest{service: ""}
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // HealthCheckResponse{status: SERVING}

  auto client = Connect(server.target());
  ASSERT_TRUE(client->Plan(Request("critic", 5, 1)).ok());
  ASSERT_TRUE(client->Plan(Request("actor", 9, 2)).ok());
  const absl::StatusOr<client::ServerStatus> s = client->GetStatus();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->rank, 0);
  EXPECT_EQ(s->world_size, 1);
  EXPECT_TRUE(s->group_ready);
  EXPECT_EQ(s->backend, "local");
  EXPECT_EQ(s->proto_version, 1);
  EXPECT_FALSE(s->build_version.empty());
  ASSERT_EQ(s->streams.size(), 2u);
  EXPECT_EQ(s->streams[0].name, "actor");
  EXPECT_EQ(s->streams[0].last_round, 9);
  EXPECT_EQ(s->streams[1].name, "critic");
  EXPECT_EQ(s->streams[1].last_round, 5);
  EXPECT_EQ(s->rounds, 2);
}

TEST(ServerE2E, ClientReachesASidecarThatStartsAfterIt) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  auto client = Connect(absl::StrCat("127.0.0.1:", port));
  absl::StatusOr<PlanResult> plan = absl::UnknownError("not run");
  std::thread caller([&] { plan = client->Plan(Request("s", 1, 1)); });
  absl::SleepFor(absl::Milliseconds(300));  // the call is waiting for the sidecar
  ServerProcess server({absl::StrCat("--listen=127.0.0.1:", port), "--shutdown_grace=1s"});
  caller.join();
  ASSERT_TRUE(server.started()) << server.stderr_text();
  EXPECT_TRUE(plan.ok()) << plan.status();
}

TEST(ServerE2E, SigtermShutsDownGracefully) {
  // Nothing in progress: the sidecar stops at once, well before its grace period ends, although
  // a client is still connected (gRPC's own shutdown would wait for it until the grace ends).
  ServerProcess server({"--log_level=debug", "--shutdown_grace=20s"});
  ASSERT_TRUE(server.started()) << server.stderr_text();
  auto client = Connect(server.target());
  ASSERT_TRUE(client->Plan(Request("s", 1, 1)).ok());
  kill(server.pid(), SIGTERM);
  ASSERT_TRUE(server.Exited(absl::Seconds(10)));
  EXPECT_TRUE(WIFEXITED(*server.exit_status()));
  EXPECT_EQ(WEXITSTATUS(*server.exit_status()), 0);
  const std::string log = server.stderr_text();
  EXPECT_THAT(log, HasSubstr("stream s round 1"));                // the debug line per round
  EXPECT_THAT(log, HasSubstr("stream s: 1 rounds completed"));    // the summary per stream
  EXPECT_FALSE(client->GetStatus(absl::Milliseconds(500)).ok());  // nobody answers any more
}

}  // namespace
}  // namespace packsched
