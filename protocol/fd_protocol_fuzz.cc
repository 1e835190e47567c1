// Fuzzes the fd-socket protocol (protocol/fd_protocol.h): the frame
// splitter the daemon runs on every session's byte stream, the request
// parser behind it, and the answer parser the client runs on what comes
// back.
//
// Input: one control byte, then a byte stream. Control bit 0 set: the
// stream is split with the real request limit (kMaxFdRequestBytes), else
// with a limit of control >> 1 (0..127) so that both complete frames and
// oversize lengths are common. The control byte also seeds the piece sizes
// the stream is fed in.
//
// Beyond not crashing, checked on every input:
//   - the splitter agrees with an independent reading of the framing (a
//     little-endian u32 length, then that many bytes): the same payloads,
//     an error exactly when a length is above the limit, otherwise the
//     rest buffered; fed all at once or in pieces of any size, it gives
//     the same; the payloads re-framed are the stream's bytes;
//   - split(encode(p)) == p for every payload, and a payload one byte over
//     the limit is an error;
//   - ParseRequest accepts exactly 'L' and a valid name (the name rules
//     checked independently), INVALID_ARGUMENT otherwise, and what it
//     accepts re-encodes to the same payload;
//   - ParseLookupAnswer never accepts an entry that does not re-encode to
//     exactly the answer it came from; an error carries the answer's code
//     (1..16) and message, anything else is INTERNAL; an error answer
//     round-trips.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "heap/name_table.h"
#include "proto/heapd.pb.h"
#include "protocol/fd_protocol.h"
#include "tools/fuzz/fuzz_seeds.h"

namespace heapd {
namespace {

void Check(bool ok, const char* property) {
  if (ok) return;
  std::fprintf(stderr, "fd_protocol_fuzz: property violated: %s\n", property);
  std::abort();
}

// What a stream holds, read without the code under test.
struct Split {
  std::vector<std::string> payloads;
  bool broken = false;  // a length above the limit
  size_t leftover = 0;  // bytes of an incomplete last frame
};

Split ModelSplit(absl::string_view stream, uint32_t max_payload) {
  Split split;
  while (stream.size() >= 4) {
    const uint32_t length = static_cast<uint8_t>(stream[0]) |
                            static_cast<uint32_t>(static_cast<uint8_t>(stream[1])) << 8 |
                            static_cast<uint32_t>(static_cast<uint8_t>(stream[2])) << 16 |
                            static_cast<uint32_t>(static_cast<uint8_t>(stream[3])) << 24;
    if (length > max_payload) {
      split.broken = true;
      return split;
    }
    if (stream.size() - 4 < length) break;
    split.payloads.emplace_back(stream.substr(4, length));
    stream.remove_prefix(4 + length);
  }
  split.leftover = stream.size();
  return split;
}

// Feeds `stream` to a splitter in pieces whose sizes come from `seed`
// (0: all at once), as recv() would hand it over.
Split Feed(absl::string_view stream, uint32_t max_payload, uint32_t seed) {
  FrameSplitter splitter(max_payload);
  Split split;
  uint32_t state = seed * 2654435761u + 1;
  while (!stream.empty() && !split.broken) {
    state = state * 1103515245u + 12345u;
    const size_t piece = seed == 0 ? stream.size() : 1 + (state >> 16) % 9;
    splitter.Append(stream.substr(0, piece));
    stream.remove_prefix(std::min(piece, stream.size()));
    for (;;) {
      absl::StatusOr<std::optional<absl::string_view>> next = splitter.Next();
      if (!next.ok()) {
        Check(next.status().code() == absl::StatusCode::kInvalidArgument,
              "the splitter failed without INVALID_ARGUMENT");
        Check(!splitter.Next().ok(), "the splitter recovered from a broken stream");
        split.broken = true;
        break;
      }
      if (!next->has_value()) break;
      split.payloads.emplace_back(**next);
    }
  }
  if (!split.broken) split.leftover = splitter.buffered();
  return split;
}

bool SameSplit(const Split& a, const Split& b) {
  return a.payloads == b.payloads && a.broken == b.broken && (a.broken || a.leftover == b.leftover);
}

void CheckFrameRoundTrip(absl::string_view payload, uint32_t max_payload) {
  const std::string frame = EncodeFrame(payload);
  absl::StatusOr<std::optional<FdFrame>> whole = NextFrame(frame, max_payload);
  Check(whole.ok() && whole->has_value() && (*whole)->payload == payload &&
            (*whole)->size == frame.size(),
        "split(encode(p)) is not p");
  if (!payload.empty()) {
    Check(!NextFrame(frame, static_cast<uint32_t>(payload.size() - 1)).ok(),
          "a frame over the limit is not an error");
  }
}

// The name rules (name_table.h), independently: 1..255 bytes, no control
// characters.
bool ModelValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

void CheckRequest(absl::string_view payload) {
  absl::StatusOr<FdRequest> request = ParseRequest(payload);
  const bool valid = !payload.empty() && payload[0] == 'L' && ModelValidName(payload.substr(1));
  Check(request.ok() == valid, "ParseRequest disagrees with the request rules");
  if (!request.ok()) {
    Check(request.status().code() == absl::StatusCode::kInvalidArgument,
          "a request was refused without INVALID_ARGUMENT");
    return;
  }
  Check(request->kind == FdRequest::Kind::kLookup && request->name == payload.substr(1),
        "a lookup does not name what it carries");
  absl::StatusOr<std::string> again = EncodeLookupRequest(request->name);
  Check(again.ok() && *again == payload, "an accepted request does not re-encode to itself");
}

void CheckAnswer(absl::string_view payload) {
  absl::StatusOr<v1::NameEntry> answer = ParseLookupAnswer(payload);
  if (answer.ok()) {
    Check(!payload.empty() && payload[0] == 0, "an answer without code 0 gave an entry");
    Check(EncodeLookupAnswer(*answer) == payload,
          "an accepted entry does not re-encode to the answer it came from");
    return;
  }
  const int code = payload.empty() ? -1 : static_cast<uint8_t>(payload[0]);
  if (code >= 1 && code <= 16) {
    Check(static_cast<int>(answer.status().code()) == code &&
              answer.status().message() == payload.substr(1),
          "an error answer lost its code or message");
  } else {
    Check(answer.status().code() == absl::StatusCode::kInternal,
          "a malformed answer is not INTERNAL");
  }
}

void CheckErrorAnswer(uint8_t control, absl::string_view message) {
  const absl::Status error(static_cast<absl::StatusCode>(1 + control % 16), message);
  Check(ParseLookupAnswer(EncodeLookupAnswer(error)).status() == error,
        "an error answer does not round-trip");
}

void FuzzOne(absl::string_view input) {
  if (input.empty()) return;
  const uint8_t control = static_cast<uint8_t>(input[0]);
  const absl::string_view stream = input.substr(1);
  const uint32_t max_payload = (control & 1) ? kMaxFdRequestBytes : control >> 1;

  const Split model = ModelSplit(stream, max_payload);
  const Split at_once = Feed(stream, max_payload, 0);
  Check(SameSplit(at_once, model), "the splitter disagrees with the framing");
  Check(SameSplit(Feed(stream, max_payload, control + 1u), model),
        "the splitter's payloads depend on how the bytes arrive");
  if (!model.broken) {
    std::string reframed;
    for (const std::string& payload : model.payloads) reframed += EncodeFrame(payload);
    Check(reframed == stream.substr(0, stream.size() - model.leftover),
          "the payloads re-framed are not the stream");
  }

  for (const std::string& payload : model.payloads) {
    CheckFrameRoundTrip(payload, max_payload);
    CheckRequest(payload);
    CheckAnswer(payload);
  }
  // The stream itself as one payload: requests and answers with no framing
  // to get right first.
  CheckRequest(stream);
  CheckAnswer(stream);
  if (stream.size() < kMaxFdAnswerBytes) CheckErrorAnswer(control, stream);
}

v1::NameEntry SampleEntry() {
  v1::NameEntry entry;
  entry.set_name("graph");
  entry.set_offset(uint64_t{6} << 20);
  entry.set_size(5 << 20);
  entry.set_type_name("app::Graph");
  entry.set_owner_uid(1000);
  entry.set_created_unix_ns(1700000000000000000);
  return entry;
}

std::string Framed(const absl::StatusOr<std::string>& payload) {
  Check(payload.ok(), "a seed request does not encode");
  return EncodeFrame(*payload);
}

}  // namespace

namespace fuzz {

Seeds MakeSeeds() {
  const std::string real_limit(1, '\x01');  // control: kMaxFdRequestBytes
  const std::string small_limit(1, static_cast<char>(64 << 1));
  const std::string lookups = Framed(EncodeLookupRequest("graph")) +
                              Framed(EncodeLookupRequest(std::string(kMaxNameLength, 'n'))) +
                              Framed(EncodeLookupRequest("bad\nname")) + EncodeFrame("X");
  const std::string answers =
      EncodeFrame(EncodeLookupAnswer(SampleEntry())) +
      EncodeFrame(EncodeLookupAnswer(v1::NameEntry())) +
      EncodeFrame(EncodeLookupAnswer(absl::NotFoundError("heap h: name 'x' is not bound")));
  return {{"lookups", real_limit + lookups},
          {"lookups_partial", real_limit + lookups.substr(0, lookups.size() - 3)},
          {"answers", real_limit + answers},
          {"answers_small_limit", small_limit + answers},
          {"oversize", real_limit + Framed(EncodeLookupRequest("a")) +
                           EncodeFrame(std::string(kMaxFdRequestBytes + 1, 'x'))},
          {"answer_entry", real_limit + EncodeLookupAnswer(SampleEntry())},
          {"empty", ""}};
}

}  // namespace fuzz
}  // namespace heapd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  heapd::FuzzOne(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
