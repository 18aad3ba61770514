#include "server/service/status_client.h"

#include <cmath>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "packsched/v1/scheduler.grpc.pb.h"
#include "server/base/status_macros.h"
#include "server/security/credentials.h"

namespace packsched::service {

absl::StatusOr<v1::GetStatusResponse> FetchStatus(const std::string& target, absl::Time deadline,
                                                  const ProbeTls* tls,
                                                  const std::string& auth_token) {
  RETURN_IF_ERROR(security::CheckTokenMayBeSent(auth_token, tls != nullptr, target,
                                                "--status =", "--tls_cert"));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, ProbeChannel(target, tls));
  std::unique_ptr<v1::Scheduler::Stub> stub = v1::Scheduler::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (!auth_token.empty()) security::AddBearerToken(context, auth_token);
  v1::GetStatusResponse response;
  const grpc::Status status = stub->GetStatus(&context, v1::GetStatusRequest(), &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("GetStatus at ", target, ": ", status.error_message()));
  }
  return response;
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void AppendQuoted(std::string& out, absl::string_view text) {
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void AppendMessage(std::string& out, const Message& message, int indent);

// One value of `field` (element `index` of a repeated field, or -1).
void AppendValue(std::string& out, const Message& message, const FieldDescriptor* field, int index,
                 int indent) {
  const Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(
          &out, rep ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(
          &out, rep ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(
          &out, rep ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(
          &out, rep ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const double v =
          field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
              ? (rep ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field))
              : (rep ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field));
      if (std::isfinite(v)) {
        absl::StrAppend(&out, v);
      } else {
        out += "null";
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      out += (rep ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                 ? "true"
                 : "false";
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      AppendQuoted(
          out,
          (rep ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field))->name());
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      AppendQuoted(
          out, rep ? r->GetRepeatedString(message, field, index) : r->GetString(message, field));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      AppendMessage(
          out, rep ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field),
          indent);
      break;
  }
}

void NewLine(std::string& out, int indent) {
  out.push_back('\n');
  out.append(static_cast<size_t>(indent) * 2, ' ');
}

// A map field: an object keyed by the entries' keys (as text), in their sorted order.
void AppendMap(std::string& out, const Message& message, const FieldDescriptor* field, int indent) {
  const Reflection* r = message.GetReflection();
  const FieldDescriptor* key = field->message_type()->map_key();
  const FieldDescriptor* value = field->message_type()->map_value();
  std::map<std::string, int> entries;  // key text -> index
  for (int i = 0; i < r->FieldSize(message, field); ++i) {
    const Message& entry = r->GetRepeatedMessage(message, field, i);
    std::string text;
    AppendValue(text, entry, key, -1, 0);
    if (!text.empty() && text.front() == '"') text = text.substr(1, text.size() - 2);
    entries[text] = i;
  }
  out.push_back('{');
  bool first = true;
  for (const auto& [text, i] : entries) {
    out += first ? "" : ",";
    first = false;
    NewLine(out, indent + 1);
    AppendQuoted(out, text);
    out += ": ";
    AppendValue(out, r->GetRepeatedMessage(message, field, i), value, -1, indent + 1);
  }
  if (!first) NewLine(out, indent);
  out.push_back('}');
}

void AppendMessage(std::string& out, const Message& message, int indent) {
  const Reflection* r = message.GetReflection();
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  out.push_back('{');
  for (int f = 0; f < d->field_count(); ++f) {
    const FieldDescriptor* field = d->field(f);
    out += f == 0 ? "" : ",";
    NewLine(out, indent + 1);
    AppendQuoted(out, field->name());
    out += ": ";
    if (field->is_map()) {
      AppendMap(out, message, field, indent + 1);
    } else if (field->is_repeated()) {
      const int n = r->FieldSize(message, field);
      out.push_back('[');
      for (int i = 0; i < n; ++i) {
        out += i == 0 ? "" : ",";
        NewLine(out, indent + 2);
        AppendValue(out, message, field, i, indent + 2);
      }
      if (n > 0) NewLine(out, indent + 1);
      out.push_back(']');
    } else {
      AppendValue(out, message, field, -1, indent + 1);
    }
  }
  if (d->field_count() > 0) NewLine(out, indent);
  out.push_back('}');
}

}  // namespace

std::string StatusJson(const v1::GetStatusResponse& status) {
  std::string json;
  AppendMessage(json, status, 0);
  return json;
}

}  // namespace packsched::service
