#include "protocol/fd_protocol.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "heap/name_table.h"

namespace heapd {
namespace {

using absl::StatusCode;

// Every payload a splitter gives, until it needs more bytes; fails the
// test on an error.
std::vector<std::string> Drain(FrameSplitter& splitter) {
  std::vector<std::string> payloads;
  for (;;) {
    absl::StatusOr<std::optional<absl::string_view>> next = splitter.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) return payloads;
    payloads.emplace_back(**next);
  }
}

TEST(FdProtocolTest, FrameIsLittleEndianLengthThenPayload) {
  EXPECT_EQ(EncodeFrame("abc"), std::string("\x03\x00\x00\x00"
                                            "abc",
                                            7));
  EXPECT_EQ(EncodeFrame(""), std::string(4, '\0'));
  const std::string long_payload(0x0102, 'x');
  EXPECT_EQ(EncodeFrame(long_payload).substr(0, 4), std::string("\x02\x01\x00\x00", 4));
}

TEST(FdProtocolTest, DecodeFrameLengthEnforcesTheLimit) {
  EXPECT_EQ(*DecodeFrameLength(EncodeFrame(std::string(4096, 'x')), kMaxFdRequestBytes), 4096u);
  absl::StatusOr<uint32_t> over = DecodeFrameLength(std::string("\x01\x10\x00\x00", 4), 4096);
  EXPECT_EQ(over.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("4097"), absl::string_view::npos) << over.status();
  EXPECT_FALSE(DecodeFrameLength(std::string("\xff\xff\xff\xff", 4), kMaxFdAnswerBytes).ok());
}

TEST(FdProtocolTest, NextFrameWaitsForWholeFrames) {
  const std::string frame = EncodeFrame("hello");
  for (size_t cut = 0; cut < frame.size(); ++cut) {
    absl::StatusOr<std::optional<FdFrame>> partial = NextFrame(frame.substr(0, cut), 4096);
    ASSERT_TRUE(partial.ok());
    EXPECT_FALSE(partial->has_value()) << cut;
  }
  const std::string stream = frame + "trailing";
  absl::StatusOr<std::optional<FdFrame>> whole = NextFrame(stream, 4096);
  ASSERT_TRUE(whole.ok() && whole->has_value());
  EXPECT_EQ((*whole)->payload, "hello");
  EXPECT_EQ((*whole)->size, frame.size());
  // Too long is an error as soon as the header is in, not once the bytes are.
  EXPECT_FALSE(NextFrame(frame.substr(0, 4), 4).ok());
}

TEST(FdProtocolTest, SplitterGivesTheSamePayloadsHoweverTheBytesArrive) {
  const std::vector<std::string> sent = {"La", "", std::string(4096, 'z'), "Lname"};
  std::string stream;
  for (const std::string& payload : sent) stream += EncodeFrame(payload);
  for (size_t piece : {size_t{1}, size_t{3}, size_t{4}, size_t{5}, size_t{4100}, stream.size()}) {
    FrameSplitter splitter(kMaxFdRequestBytes);
    std::vector<std::string> got;
    for (size_t at = 0; at < stream.size(); at += piece) {
      splitter.Append(absl::string_view(stream).substr(at, piece));
      for (std::string& payload : Drain(splitter)) got.push_back(std::move(payload));
    }
    EXPECT_EQ(got, sent) << "pieces of " << piece;
    EXPECT_EQ(splitter.buffered(), 0u);
  }
}

TEST(FdProtocolTest, SplitterStaysBrokenAfterAnOversizeFrame) {
  FrameSplitter splitter(16);
  splitter.Append(EncodeFrame("ok") + EncodeFrame(std::string(17, 'x')) + EncodeFrame("later"));
  absl::StatusOr<std::optional<absl::string_view>> first = splitter.Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(**first, "ok");
  EXPECT_EQ(splitter.Next().status().code(), StatusCode::kInvalidArgument);
  splitter.Append(EncodeFrame("more"));
  EXPECT_EQ(splitter.Next().status().code(), StatusCode::kInvalidArgument);
}

TEST(FdProtocolTest, LookupRequestRoundTrips) {
  absl::StatusOr<std::string> payload = EncodeLookupRequest("graph root");
  ASSERT_TRUE(payload.ok());
  EXPECT_EQ(*payload, "Lgraph root");
  absl::StatusOr<FdRequest> request = ParseRequest(*payload);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->kind, FdRequest::Kind::kLookup);
  EXPECT_EQ(request->name, "graph root");
  // The longest payload that fits.
  EXPECT_TRUE(EncodeLookupRequest(std::string(kMaxFdRequestBytes - 1, 'n')).ok());
  EXPECT_EQ(EncodeLookupRequest(std::string(kMaxFdRequestBytes, 'n')).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(FdProtocolTest, ParseRequestRejectsUnknownRequestsAndBadNames) {
  for (const std::string& payload : {std::string(), std::string("X"), std::string("lname")}) {
    absl::StatusOr<FdRequest> request = ParseRequest(payload);
    EXPECT_EQ(request.status().code(), StatusCode::kInvalidArgument) << payload;
    EXPECT_NE(request.status().message().find("unknown"), absl::string_view::npos);
  }
  EXPECT_EQ(ParseRequest("L").status().code(), StatusCode::kInvalidArgument);  // empty name
  absl::StatusOr<FdRequest> control = ParseRequest(std::string("Lbad\nname"));
  EXPECT_EQ(control.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(control.status().message().find("control character"), absl::string_view::npos);
  EXPECT_FALSE(ParseRequest("L" + std::string(kMaxNameLength + 1, 'n')).ok());
}

TEST(FdProtocolTest, AnswerCarriesAnEntry) {
  v1::NameEntry entry;
  entry.set_name("root");
  entry.set_offset(4 << 20);
  entry.set_size(64);
  entry.set_type_name("app::Graph");
  entry.set_owner_uid(1000);
  entry.set_created_unix_ns(-5);
  const std::string payload = EncodeLookupAnswer(entry);
  EXPECT_EQ(payload[0], '\0');
  absl::StatusOr<v1::NameEntry> parsed = ParseLookupAnswer(payload);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SerializeAsString(), entry.SerializeAsString());
  // An entry with every field at its default is the empty message.
  EXPECT_TRUE(ParseLookupAnswer(std::string(1, '\0')).ok());
}

TEST(FdProtocolTest, AnswerCarriesAnError) {
  const std::string payload = EncodeLookupAnswer(absl::NotFoundError("name 'x' is not bound"));
  EXPECT_EQ(payload,
            std::string(1, static_cast<char>(StatusCode::kNotFound)) + "name 'x' is not bound");
  absl::StatusOr<v1::NameEntry> parsed = ParseLookupAnswer(payload);
  EXPECT_EQ(parsed.status(), absl::NotFoundError("name 'x' is not bound"));
  // Cut to fit an answer.
  const std::string huge(kMaxFdAnswerBytes + 10, 'm');
  EXPECT_EQ(EncodeLookupAnswer(absl::InternalError(huge)).size(), kMaxFdAnswerBytes);
}

TEST(FdProtocolTest, ParseLookupAnswerRejectsWhatTheDaemonNeverSends) {
  EXPECT_EQ(ParseLookupAnswer("").status().code(), StatusCode::kInternal);
  // Status codes end at 16 (UNAUTHENTICATED).
  EXPECT_EQ(ParseLookupAnswer(std::string(1, '\x10') + "who").status(),
            absl::UnauthenticatedError("who"));
  absl::StatusOr<v1::NameEntry> unknown = ParseLookupAnswer(std::string(1, '\x11') + "what");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInternal);
  EXPECT_NE(unknown.status().message().find("17"), absl::string_view::npos);
  // Not a NameEntry.
  EXPECT_EQ(ParseLookupAnswer(std::string("\0\x0a\x05"
                                          "ab",
                                          5))
                .status()
                .code(),
            StatusCode::kInternal);
  // A NameEntry, but not as the daemon encodes it: a field repeated, and a
  // varint with a redundant continuation byte.
  v1::NameEntry entry;
  entry.set_name("a");
  const std::string twice =
      std::string(1, '\0') + entry.SerializeAsString() + entry.SerializeAsString();
  EXPECT_EQ(ParseLookupAnswer(twice).status().code(), StatusCode::kInternal);
  EXPECT_EQ(ParseLookupAnswer(std::string("\0\x10\x81\x00", 4)).status().code(),
            StatusCode::kInternal);
  EXPECT_TRUE(ParseLookupAnswer(std::string("\0\x10\x01", 3)).ok());
}

}  // namespace
}  // namespace heapd
