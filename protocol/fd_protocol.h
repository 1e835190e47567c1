// What a session says on its heapd.fd.sock connection once the daemon has
// sent it the heap's fd (the token exchange before that is FdServer's,
// daemon/fd_server.h). Both ends use this file, so the format is written in
// one place: the daemon (FdServer, HeapdService::AnswerFdRequest) and the
// client library (GrpcSessionCalls::Lookup).
//
// Framing, both ways: a 4-byte little-endian payload length, then the
// payload. A request payload is at most kMaxFdRequestBytes, an answer's at
// most kMaxFdAnswerBytes; a longer length means the peer does not speak
// this protocol, and the stream cannot be resynchronized.
//
// Requests, answered in order, one answer each:
//   'L' name    look `name` up in the session's heap.
// Answers: one byte, an absl::StatusCode; 0 (OK) is followed by a
// serialized heapd.v1.NameEntry, any other code by the error message.
//
// Everything here is pure: no I/O, no state but FrameSplitter's buffer.
#ifndef HEAPD_PROTOCOL_FD_PROTOCOL_H_
#define HEAPD_PROTOCOL_FD_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/heapd.pb.h"

namespace heapd {

inline constexpr size_t kFdFrameHeaderBytes = 4;
// Largest request payload: a name lookup of the longest name fits.
inline constexpr uint32_t kMaxFdRequestBytes = 4096;
// Largest answer payload the client accepts (answers are far smaller: a
// name entry of two bounded names, or an error message).
inline constexpr uint32_t kMaxFdAnswerBytes = uint32_t{1} << 20;

// `payload` framed. REQUIRES: payload.size() <= UINT32_MAX.
std::string EncodeFrame(absl::string_view payload);

// The payload length announced by a frame header (its first
// kFdFrameHeaderBytes bytes). INVALID_ARGUMENT when it is above
// `max_payload`. REQUIRES: header.size() >= kFdFrameHeaderBytes.
absl::StatusOr<uint32_t> DecodeFrameLength(absl::string_view header, uint32_t max_payload);

// A frame at the start of a byte stream.
struct FdFrame {
  absl::string_view payload;  // points into the stream
  size_t size = 0;            // header and payload
};

// The frame at the start of `bytes`: nullopt while it is incomplete; an
// error (DecodeFrameLength's) when it announces more than `max_payload`.
absl::StatusOr<std::optional<FdFrame>> NextFrame(absl::string_view bytes, uint32_t max_payload);

// Cuts a byte stream that arrives in pieces into payloads, however the
// pieces fall. Once the stream broke the protocol, every Next() fails.
class FrameSplitter {
 public:
  explicit FrameSplitter(uint32_t max_payload) : max_payload_(max_payload) {}

  // Adds bytes received. Invalidates payloads returned before.
  void Append(absl::string_view bytes);

  // The next complete payload (valid until the next Append), nullopt when
  // more bytes are needed, or INVALID_ARGUMENT when the stream is not this
  // protocol.
  absl::StatusOr<std::optional<absl::string_view>> Next();

  // Bytes received and not yet returned in a payload: a partial frame.
  // Bounded by kFdFrameHeaderBytes + max_payload plus the last Append.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  uint32_t max_payload_;
  std::string buffer_;
  size_t consumed_ = 0;  // bytes of buffer_ already returned
  absl::Status broken_;
};

// A parsed request.
struct FdRequest {
  enum class Kind { kLookup };
  Kind kind = Kind::kLookup;
  absl::string_view name;  // kLookup: points into the payload
};

// The payload of a lookup of `name`. INVALID_ARGUMENT when it would be
// longer than kMaxFdRequestBytes. The name itself is checked by the daemon.
absl::StatusOr<std::string> EncodeLookupRequest(absl::string_view name);

// Parses a request payload. INVALID_ARGUMENT for an unknown request or an
// invalid name (ValidateName's message).
absl::StatusOr<FdRequest> ParseRequest(absl::string_view payload);

// The answer payload of a lookup: the entry, or the error (its message cut
// so that the answer fits kMaxFdAnswerBytes).
std::string EncodeLookupAnswer(const absl::StatusOr<v1::NameEntry>& answer);

// Parses an answer payload: the entry, or the daemon's error with its code
// and message. INTERNAL when the answer is empty, carries a code that is
// not a status code, or an entry that does not parse or is not the one
// encoding the daemon sends (so every accepted entry re-encodes to exactly
// the bytes received).
absl::StatusOr<v1::NameEntry> ParseLookupAnswer(absl::string_view payload);

}  // namespace heapd

#endif  // HEAPD_PROTOCOL_FD_PROTOCOL_H_
