#include "protocol/fd_protocol.h"

#include "absl/strings/str_cat.h"
#include "heap/name_table.h"

namespace heapd {
namespace {

constexpr char kLookup = 'L';
// absl::StatusCode values run from kOk (0) to kUnauthenticated (16).
constexpr int kLastStatusCode = static_cast<int>(absl::StatusCode::kUnauthenticated);

}  // namespace

std::string EncodeFrame(absl::string_view payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::string frame(kFdFrameHeaderBytes, '\0');
  for (size_t i = 0; i < kFdFrameHeaderBytes; ++i) frame[i] = static_cast<char>(length >> (8 * i));
  frame.append(payload.data(), payload.size());
  return frame;
}

absl::StatusOr<uint32_t> DecodeFrameLength(absl::string_view header, uint32_t max_payload) {
  uint32_t length = 0;
  for (size_t i = 0; i < kFdFrameHeaderBytes; ++i) {
    length |= uint32_t{static_cast<uint8_t>(header[i])} << (8 * i);
  }
  if (length > max_payload) {
    return absl::InvalidArgumentError(absl::StrCat("a frame announces ", length,
                                                   " bytes, more than the limit of ", max_payload,
                                                   ": not heapd's fd protocol"));
  }
  return length;
}

absl::StatusOr<std::optional<FdFrame>> NextFrame(absl::string_view bytes, uint32_t max_payload) {
  if (bytes.size() < kFdFrameHeaderBytes) return std::nullopt;
  absl::StatusOr<uint32_t> length = DecodeFrameLength(bytes, max_payload);
  if (!length.ok()) return length.status();
  if (bytes.size() - kFdFrameHeaderBytes < *length) return std::nullopt;
  return FdFrame{bytes.substr(kFdFrameHeaderBytes, *length), kFdFrameHeaderBytes + *length};
}

void FrameSplitter::Append(absl::string_view bytes) {
  // Payloads returned so far are dropped only now: they stay valid until
  // the caller has answered them.
  buffer_.erase(0, consumed_);
  consumed_ = 0;
  buffer_.append(bytes.data(), bytes.size());
}

absl::StatusOr<std::optional<absl::string_view>> FrameSplitter::Next() {
  if (!broken_.ok()) return broken_;
  absl::StatusOr<std::optional<FdFrame>> frame =
      NextFrame(absl::string_view(buffer_).substr(consumed_), max_payload_);
  if (!frame.ok()) {
    broken_ = frame.status();
    return broken_;
  }
  if (!frame->has_value()) return std::nullopt;
  consumed_ += (*frame)->size;
  return (*frame)->payload;
}

absl::StatusOr<std::string> EncodeLookupRequest(absl::string_view name) {
  if (name.size() + 1 > kMaxFdRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name of ", name.size(), " bytes is too long"));
  }
  return absl::StrCat(absl::string_view(&kLookup, 1), name);
}

absl::StatusOr<FdRequest> ParseRequest(absl::string_view payload) {
  if (payload.empty() || payload[0] != kLookup) {
    return absl::InvalidArgumentError("unknown fd-socket request");
  }
  FdRequest request;
  request.kind = FdRequest::Kind::kLookup;
  request.name = payload.substr(1);
  if (absl::Status s = ValidateName(request.name); !s.ok()) return s;
  return request;
}

std::string EncodeLookupAnswer(const absl::StatusOr<v1::NameEntry>& answer) {
  if (answer.ok()) return std::string(1, '\0') + answer->SerializeAsString();
  const absl::string_view message = answer.status().message();
  return std::string(1, static_cast<char>(answer.status().code())) +
         std::string(message.substr(0, kMaxFdAnswerBytes - 1));
}

absl::StatusOr<v1::NameEntry> ParseLookupAnswer(absl::string_view payload) {
  if (payload.empty()) return absl::InternalError("heapd sent an empty answer");
  const int code = static_cast<uint8_t>(payload[0]);
  const absl::string_view rest = payload.substr(1);
  if (code > kLastStatusCode) {
    return absl::InternalError(
        absl::StrCat("heapd answered with status code ", code, ", which does not exist: ", rest));
  }
  if (code != 0) return absl::Status(static_cast<absl::StatusCode>(code), rest);
  v1::NameEntry entry;
  if (!entry.ParseFromArray(rest.data(), static_cast<int>(rest.size())) ||
      entry.SerializeAsString() != rest) {
    return absl::InternalError("heapd sent a malformed name entry");
  }
  return entry;
}

}  // namespace heapd
