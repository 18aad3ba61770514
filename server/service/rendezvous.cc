#include "server/service/rendezvous.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "packsched/v1/rendezvous.grpc.pb.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"
#include "server/service/scheduler_service.h"

namespace packsched::service {
namespace {

// How often every rank pings rank 0's store connection (rendezvous.h).
constexpr absl::Duration kKeepalive = absl::Seconds(1);

namespace pb = ::packsched::v1;

absl::Status FromGrpc(const grpc::Status& status, absl::string_view address,
                      absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("rendezvous store ", address, ": ", what, ": ", status.error_message()));
}

// The request's bytes parsed into `message`: InvalidArgument naming the message otherwise.
template <typename Message>
absl::Status ParseBody(const grpc::ByteBuffer* in, Message* message) {
  grpc::ByteBuffer bytes(*in);  // shares the slices; Deserialize consumes its buffer
  if (grpc::SerializationTraits<Message>::Deserialize(&bytes, message).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", Message::descriptor()->full_name(),
                   " (malformed protobuf wire data, or a string field that is not valid UTF-8)"));
}

// `message` serialized into `out` (gRPC's response buffer).
template <typename Message>
grpc::Status WriteBody(const Message& message, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  return grpc::SerializationTraits<Message>::Serialize(message, out, &own_buffer);
}

// The Rendezvous service over an InMemoryStore (callback API: no call holds a thread). Its
// methods take the request's bytes and parse them here, so that a body that does not parse is
// answered INVALID_ARGUMENT with a message naming the message type (as the Scheduler service
// does), not gRPC's own bare refusal.
using RawRendezvous = pb::Rendezvous::WithRawCallbackMethod_Set<
    pb::Rendezvous::WithRawCallbackMethod_Get<pb::Rendezvous::WithRawCallbackMethod_TryGet<
        pb::Rendezvous::WithRawCallbackMethod_CompareAndSet<
            pb::Rendezvous::WithRawCallbackMethod_DeletePrefix<pb::Rendezvous::Service>>>>>;

class RendezvousService final : public RawRendezvous {
 public:
  RendezvousService(collective::InMemoryStore* store, std::string auth_token)
      : store_(store), auth_token_(std::move(auth_token)) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                grpc::ByteBuffer* out) override {
    pb::RendezvousSetRequest request;
    absl::Status status = Authorize(*context);
    if (status.ok()) status = ParseBody(in, &request);
    if (status.ok()) status = store_->Set(request.key(), request.value(), Forever());
    return Finished(context, status, pb::RendezvousSetResponse(), out);
  }

  grpc::ServerUnaryReactor* TryGet(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                   grpc::ByteBuffer* out) override {
    pb::RendezvousGetRequest request;
    pb::RendezvousTryGetResponse response;
    absl::Status status = Authorize(*context);
    if (status.ok()) status = ParseBody(in, &request);
    if (status.ok()) {
      absl::StatusOr<std::optional<std::string>> value = store_->TryGet(request.key(), Forever());
      status = value.status();
      if (value.ok() && value->has_value()) {
        response.set_found(true);
        response.set_value(**std::move(value));
      }
    }
    return Finished(context, status, response, out);
  }

  grpc::ServerUnaryReactor* CompareAndSet(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* in,
                                          grpc::ByteBuffer* out) override {
    pb::RendezvousCompareAndSetRequest request;
    pb::RendezvousCompareAndSetResponse response;
    absl::Status status = Authorize(*context);
    if (status.ok()) status = ParseBody(in, &request);
    if (status.ok()) {
      std::optional<absl::string_view> expected;
      if (request.has_expected()) expected = request.expected();
      absl::StatusOr<std::string> value =
          store_->CompareAndSet(request.key(), expected, request.desired(), Forever());
      status = value.status();
      if (value.ok()) response.set_value(*std::move(value));
    }
    return Finished(context, status, response, out);
  }

  grpc::ServerUnaryReactor* DeletePrefix(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override {
    pb::RendezvousDeletePrefixRequest request;
    pb::RendezvousDeletePrefixResponse response;
    absl::Status status = Authorize(*context);
    if (status.ok()) status = ParseBody(in, &request);
    if (status.ok()) {
      absl::StatusOr<int64_t> deleted = store_->DeletePrefix(request.prefix(), Forever());
      status = deleted.status();
      if (deleted.ok()) response.set_deleted(*deleted);
    }
    return Finished(context, status, response, out);
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context, const grpc::ByteBuffer* in,
                                grpc::ByteBuffer* out) override {
    pb::RendezvousGetRequest request;
    absl::Status status = Authorize(*context);
    if (status.ok()) status = ParseBody(in, &request);
    if (status.ok() && context->deadline() == std::chrono::system_clock::time_point::max()) {
      status = absl::InvalidArgumentError("Rendezvous.Get needs a deadline (it waits for the key)");
    }
    if (!status.ok()) return Finished(context, status, pb::RendezvousGetResponse(), out);
    auto* reactor = new GetReactor(store_, request.key(), out);
    reactor->Start();
    return reactor;
  }

 private:
  // Completes when the key is set (the store's watch) or when the call is cancelled — which is
  // what gRPC does when the client's deadline passes — whichever comes first. The store's
  // CancelWatch decides the race: the watch callback finishes the call unless it was cancelled.
  class GetReactor final : public grpc::ServerUnaryReactor {
   public:
    GetReactor(collective::InMemoryStore* store, std::string key, grpc::ByteBuffer* out)
        : store_(store), key_(std::move(key)), out_(out) {}

    // The watch callback may finish the call (and gRPC may then call OnDone) before Start
    // returns: the reactor is deleted by whichever of Start and OnDone ends last.
    void Start() {
      const int64_t id = store_->Watch(key_, [this](std::string value) {
        pb::RendezvousGetResponse response;
        response.set_value(std::move(value));
        Finish(WriteBody(response, out_));
      });
      {
        absl::MutexLock lock(&mu_);
        watch_id_ = id;
        if (cancelled_) CancelNow();
      }
      Unref();
    }

    void OnCancel() override {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (watch_id_ >= 0) CancelNow();
    }

    void OnDone() override { Unref(); }

   private:
    void Unref() {
      if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
    }

    void CancelNow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (cancel_done_) return;
      cancel_done_ = true;
      if (store_->CancelWatch(watch_id_)) {
        Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("key '", key_, "' was not set in time")));
      }
    }

    collective::InMemoryStore* const store_;
    const std::string key_;
    grpc::ByteBuffer* const out_;  // gRPC's response buffer
    absl::Mutex mu_;
    int64_t watch_id_ ABSL_GUARDED_BY(mu_) = -1;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    bool cancel_done_ ABSL_GUARDED_BY(mu_) = false;
    std::atomic<int> refs_{2};  // Start and OnDone
  };

  static absl::Time Forever() { return absl::InfiniteFuture(); }

  // Answers `status`, with `response` when it is OK.
  template <typename Response>
  static grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context,
                                            const absl::Status& status, const Response& response,
                                            grpc::ByteBuffer* out) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status.ok() ? WriteBody(response, out) : ToGrpcStatus(status));
    return reactor;
  }

  absl::Status Authorize(const grpc::CallbackServerContext& context) const {
    return security::CheckBearerToken(security::AuthorizationOf(context), auth_token_);
  }

  collective::InMemoryStore* const store_;
  const std::string auth_token_;
};

}  // namespace

struct RendezvousServer::State {
  std::unique_ptr<RendezvousService> service;  // outlives `server`
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool shut_down = false;
};

RendezvousServer::RendezvousServer(std::unique_ptr<State> state) : state_(std::move(state)) {}
RendezvousServer::~RendezvousServer() { Shutdown(); }
int RendezvousServer::port() const { return state_->port; }

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    collective::InMemoryStore* store, const RendezvousServerOptions& options) {
  if (options.tls.enabled && (options.tls.cert.empty() || options.tls.key.empty())) {
    return absl::InvalidArgumentError("TLS on the rendezvous port needs --tls_cert and --tls_key");
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ServerCredentials> credentials,
      security::MakeServerCredentials(
          options.tls.enabled
              ? security::ServerTlsFiles{options.tls.cert, options.tls.key, options.tls.ca}
              : security::ServerTlsFiles{}));
  RETURN_IF_ERROR(security::CheckTokenMayBeAccepted(options.auth_token, options.tls.enabled,
                                                    options.listen, "the rendezvous address"));
  auto state = std::make_unique<State>();
  state->service = std::make_unique<RendezvousService>(store, options.auth_token);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &state->port);
  builder.RegisterService(state->service.get());
  // The ranks' keepalive pings (below), every second even without calls, are welcome.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(kKeepalive / absl::Milliseconds(1)) / 2);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  state->server = builder.BuildAndStart();
  if (state->server == nullptr || state->port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the rendezvous store on ", options.listen));
  }
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(state)));
}

void RendezvousServer::Shutdown() {
  if (state_->shut_down) return;
  state_->shut_down = true;
  // Waiting Gets are cancelled at once (OnCancel cancels their watches).
  state_->server->Shutdown(std::chrono::system_clock::now());
  state_->server->Wait();
}

struct RendezvousStore::State {
  RendezvousClientOptions options;
  std::shared_ptr<pb::Rendezvous::Stub> stub;  // shared by the store and its fail-fast view
  std::shared_ptr<grpc::Channel> channel;      // the stub's, for its connectivity
  std::atomic<bool> watched_ready{false};      // AwaitDisconnect last saw a connection up
  bool wait_for_ready = true;
  absl::Mutex mu;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_set<grpc::ClientContext*> active ABSL_GUARDED_BY(mu);  // calls in progress

  // Whether a call that ended with `status` is made again: a connection the channel dropped
  // because rank 0 did not answer a keepalive ping within kKeepalive (a rank 0 busy or stalled
  // for seconds, or a link cut), ended before the call's deadline, in the waiting view. The call
  // is made again on the channel's next connection, within the same deadline; a rank 0 that died
  // (its connections reset) fails the call as before. Every method may be made again: Set, Get,
  // TryGet and DeletePrefix are idempotent, and a CompareAndSet made again answers the value
  // stored, `desired` if the first one took.
  bool Retried(const grpc::Status& status, absl::Time deadline) const {
    return wait_for_ready && status.error_code() == grpc::StatusCode::UNAVAILABLE &&
           absl::StrContains(absl::AsciiStrToLower(status.error_message()), "keepalive") &&
           absl::Now() < deadline;
  }

  void Prepare(grpc::ClientContext& context, absl::Time deadline) const {
    context.set_deadline(absl::ToChronoTime(deadline));
    // Rank 0 may not be up yet: wait for the channel (bounded by the deadline) instead of failing.
    context.set_wait_for_ready(wait_for_ready);
    security::AddBearerToken(context, options.auth_token);
  }
};

// One call's context, registered for Cancel() while the call is in progress.
class RendezvousStore::Call {
 public:
  Call(State& state, absl::Time deadline) : state_(state) {
    state_.Prepare(context_, deadline);
    absl::MutexLock lock(&state_.mu);
    refused_ = state_.cancelled;
    if (!refused_) state_.active.insert(&context_);
  }
  ~Call() {
    absl::MutexLock lock(&state_.mu);  // Cancel() never touches a context that is gone
    state_.active.erase(&context_);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Cancelled if Cancel() came first (then the call must not be made).
  absl::Status Refused() const { return refused_ ? CancelledStatus() : absl::OkStatus(); }
  grpc::ClientContext* context() { return &context_; }
  // The call's outcome: a call ended by Cancel() says so rather than gRPC's bare "Cancelled".
  absl::Status Finish(const grpc::Status& status, absl::string_view what) {
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      absl::MutexLock lock(&state_.mu);
      if (state_.cancelled) return CancelledStatus();
    }
    return FromGrpc(status, state_.options.address, what);
  }

 private:
  absl::Status CancelledStatus() const {
    return absl::CancelledError(absl::StrCat("rendezvous store ", state_.options.address,
                                             ": cancelled (the sidecar is shutting down)"));
  }

  State& state_;
  grpc::ClientContext context_;
  bool refused_ = false;
};

RendezvousStore::RendezvousStore(std::unique_ptr<State> state) : state_(std::move(state)) {}
RendezvousStore::~RendezvousStore() = default;

void RendezvousStore::Cancel() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->cancelled = true;
    for (grpc::ClientContext* context : state_->active) context->TryCancel();
  }
  if (fail_fast_ != nullptr) fail_fast_->Cancel();  // the view's calls end too
}

absl::StatusOr<std::unique_ptr<RendezvousStore>> RendezvousStore::Create(
    const RendezvousClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("--rendezvous is empty");
  RETURN_IF_ERROR(security::CheckTokenMayBeSent(options.auth_token, options.tls.enabled,
                                                options.address,
                                                "--rendezvous =", "--rendezvous_tls"));
  std::optional<security::ChannelTls> tls;
  if (options.tls.enabled) {
    tls.emplace();
    tls->root_certs = {"--rendezvous_tls_ca", options.tls.ca};  // empty: the system roots
    tls->cert = {"--tls_cert", options.tls.cert};
    tls->key = {"--tls_key", options.tls.key};
  }
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff starts at 1 s; ranks started before rank 0 would idle.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  // A connection to rank 0 whose packets stop (a link cut) is dropped within about two
  // keepalive periods and made anew: TCP alone would retransmit into it with a growing backoff
  // and heal seconds after the link is back (up to 10.8 s in the fault suite's two-way cuts of
  // rank 0).
  const int keepalive_ms = static_cast<int>(kKeepalive / absl::Milliseconds(1));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   security::MakeChannel(options.address, tls, args));
  auto state = std::make_unique<State>();
  state->options = options;
  state->channel = channel;
  state->stub = pb::Rendezvous::NewStub(std::move(channel));
  auto fail_fast_state = std::make_unique<State>();
  fail_fast_state->options = options;
  fail_fast_state->stub = state->stub;
  fail_fast_state->channel = state->channel;
  fail_fast_state->wait_for_ready = false;
  std::unique_ptr<RendezvousStore> store(new RendezvousStore(std::move(state)));
  store->fail_fast_.reset(new RendezvousStore(std::move(fail_fast_state)));
  return store;
}

collective::KeyValueStore& RendezvousStore::FailFast() {
  return fail_fast_ != nullptr ? *fail_fast_ : *this;
}

absl::StatusOr<bool> RendezvousStore::AwaitDisconnect(absl::Time deadline) {
  grpc::Channel& channel = *state_->channel;
  const grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/false);
  if (state != GRPC_CHANNEL_READY) {
    // A connection that dropped between two calls (this thread was not running) still counts.
    if (state_->watched_ready.exchange(false)) return true;
    channel.WaitForStateChange(state, absl::ToChronoTime(deadline));
    return false;
  }
  state_->watched_ready = true;
  if (!channel.WaitForStateChange(state, absl::ToChronoTime(deadline))) return false;
  state_->watched_ready = false;
  return true;
}

absl::Status RendezvousStore::Set(absl::string_view key, absl::string_view value,
                                  absl::Time deadline) {
  pb::RendezvousSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  pb::RendezvousSetResponse response;
  for (;;) {
    Call call(*state_, deadline);
    RETURN_IF_ERROR(call.Refused());
    const grpc::Status status = state_->stub->Set(call.context(), request, &response);
    if (state_->Retried(status, deadline)) continue;
    return call.Finish(status, absl::StrCat("set '", key, "'"));
  }
}

absl::StatusOr<std::string> RendezvousStore::Get(absl::string_view key, absl::Time deadline) {
  pb::RendezvousGetRequest request;
  request.set_key(std::string(key));
  pb::RendezvousGetResponse response;
  for (;;) {
    Call call(*state_, deadline);
    RETURN_IF_ERROR(call.Refused());
    const grpc::Status status = state_->stub->Get(call.context(), request, &response);
    if (state_->Retried(status, deadline)) continue;
    RETURN_IF_ERROR(call.Finish(status, absl::StrCat("get '", key, "'")));
    return std::move(*response.mutable_value());
  }
}

absl::StatusOr<std::optional<std::string>> RendezvousStore::TryGet(absl::string_view key,
                                                                   absl::Time deadline) {
  pb::RendezvousGetRequest request;
  request.set_key(std::string(key));
  pb::RendezvousTryGetResponse response;
  for (;;) {
    Call call(*state_, deadline);
    RETURN_IF_ERROR(call.Refused());
    const grpc::Status status = state_->stub->TryGet(call.context(), request, &response);
    if (state_->Retried(status, deadline)) continue;
    RETURN_IF_ERROR(call.Finish(status, absl::StrCat("try-get '", key, "'")));
    if (!response.found()) return std::nullopt;
    return std::move(*response.mutable_value());
  }
}

absl::StatusOr<std::string> RendezvousStore::CompareAndSet(
    absl::string_view key, std::optional<absl::string_view> expected, absl::string_view desired,
    absl::Time deadline) {
  pb::RendezvousCompareAndSetRequest request;
  request.set_key(std::string(key));
  if (expected) {
    request.set_has_expected(true);
    request.set_expected(std::string(*expected));
  }
  request.set_desired(std::string(desired));
  pb::RendezvousCompareAndSetResponse response;
  for (;;) {
    Call call(*state_, deadline);
    RETURN_IF_ERROR(call.Refused());
    const grpc::Status status = state_->stub->CompareAndSet(call.context(), request, &response);
    if (state_->Retried(status, deadline)) continue;
    RETURN_IF_ERROR(call.Finish(status, absl::StrCat("compare-and-set '", key, "'")));
    return std::move(*response.mutable_value());
  }
}

absl::StatusOr<int64_t> RendezvousStore::DeletePrefix(absl::string_view prefix,
                                                      absl::Time deadline) {
  pb::RendezvousDeletePrefixRequest request;
  request.set_prefix(std::string(prefix));
  pb::RendezvousDeletePrefixResponse response;
  for (;;) {
    Call call(*state_, deadline);
    RETURN_IF_ERROR(call.Refused());
    const grpc::Status status = state_->stub->DeletePrefix(call.context(), request, &response);
    if (state_->Retried(status, deadline)) continue;
    RETURN_IF_ERROR(call.Finish(status, absl::StrCat("delete-prefix '", prefix, "'")));
    return response.deleted();
  }
}

absl::StatusOr<std::string> LocalAddressTowards(absl::string_view address) {
  std::string host(address);
  std::string port = "0";
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == std::string::npos) return absl::InvalidArgumentError("bad address " + host);
    if (close + 2 < host.size()) port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "' (DNS lookup): ", gai_strerror(rc)));
  }
  absl::Status error = absl::UnavailableError(absl::StrCat("no route to '", address, "'"));
  std::string local;
  for (addrinfo* a = found; a != nullptr && local.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage mine = {};
    socklen_t size = sizeof(mine);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &size) == 0) {
      char text[NI_MAXHOST];
      if (getnameinfo(reinterpret_cast<sockaddr*>(&mine), size, text, sizeof(text), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
        local = text;
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (local.empty()) return error;
  return local;
}

}  // namespace packsched::service
