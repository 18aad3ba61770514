#ifndef PACKSCHED_SERVER_SERVICE_SERVICE_CALL_H_
#define PACKSCHED_SERVER_SERVICE_SERVICE_CALL_H_

// One call of packsched.v1.Scheduler as the service serves it (scheduler_service.h). The service
// registers gRPC's raw methods and parses the request itself, so that a body that does not parse
// (malformed wire data, or a string field that is not UTF-8) is answered INVALID_ARGUMENT naming
// the message — gRPC's own parse failure is UNIMPLEMENTED with no message. The request and the
// response live on a protobuf arena that the call owns: a plan response is a few hundred
// sub-messages and repeated fields (one per micro-batch), which the arena allocates from a few
// blocks and frees at once. The call is its own reactor and deletes itself when gRPC is done with
// it, after the response is written; so does whatever the arena owns (the call's memory
// reservation, memory_budget.h).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/arena.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace packsched::service {

class ServiceCall : public grpc::ServerUnaryReactor {
 public:
  // Calls alive in this process (created and not yet done): what a shutdown waits for.
  static int64_t Live();

  // Finishes the call: with the response serialized when `status` is OK. Once.
  virtual void Answer(const grpc::Status& status) = 0;

  ~ServiceCall() override;  // by OnDone only

 protected:
  ServiceCall();

 private:
  void OnDone() final { delete this; }
};

template <typename Request, typename Response>
class TypedCall final : public ServiceCall {
 public:
  // `out`: where gRPC takes the serialized response from; owned by gRPC, valid until done.
  explicit TypedCall(grpc::ByteBuffer* out) : arena_(ArenaOptions()), out_(out) {
    request_ = google::protobuf::Arena::CreateMessage<Request>(&arena_);
    response_ = google::protobuf::Arena::CreateMessage<Response>(&arena_);
  }

  // Parses the request's bytes into request(): InvalidArgument naming the message otherwise.
  absl::Status Parse(const grpc::ByteBuffer& in) {
    grpc::ByteBuffer bytes(in);  // shares the slices; Deserialize consumes its buffer
    if (grpc::SerializationTraits<Request>::Deserialize(&bytes, request_).ok()) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the request is not a valid ", Request::descriptor()->full_name(),
                     " (malformed protobuf wire data, or a string field that is not valid UTF-8)"));
  }

  Request* request() { return request_; }
  Response* response() { return response_; }

  void Answer(const grpc::Status& status) override {
    if (status.ok()) {
      bool own_buffer = false;
      grpc::Status serialized =
          grpc::SerializationTraits<Response>::Serialize(*response_, out_, &own_buffer);
      if (!serialized.ok()) {
        Finish(grpc::Status(
            grpc::StatusCode::INTERNAL,
            absl::StrCat("serializing the response failed: ", serialized.error_message())));
        return;
      }
    }
    Finish(status);
  }

 private:
  // Blocks start at 16 KiB (a 1,024-sequence request is about 16 KiB).
  static google::protobuf::ArenaOptions ArenaOptions() {
    google::protobuf::ArenaOptions options;
    options.start_block_size = 16 << 10;
    options.max_block_size = 256 << 10;
    return options;
  }

  google::protobuf::Arena arena_;
  grpc::ByteBuffer* const out_;
  Request* request_;
  Response* response_;
};

}  // namespace packsched::service

#endif  // PACKSCHED_SERVER_SERVICE_SERVICE_CALL_H_
