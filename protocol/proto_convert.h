// Conversions between heapd's own types and the heapd.v1 messages, for
// the gRPC service, the fd-socket answers, the client and its in-process
// session. Pure code.
#ifndef HEAPD_PROTOCOL_PROTO_CONVERT_H_
#define HEAPD_PROTOCOL_PROTO_CONVERT_H_

#include <vector>

#include "allocator/lease_types.h"
#include "heap/data_file.h"
#include "heap/name_table.h"
#include "proto/heapd.pb.h"

namespace heapd {

v1::BackingKind ToProto(BackingKind kind);
void ToProto(const NameEntry& entry, v1::NameEntry* out);
void ToProto(const LeaseGrant& grant, v1::LeaseGrant* out);
void ToProto(const LeaseCorrection& correction, v1::LeaseCorrection* out);
void ToProto(const LeaseReport& report, v1::LeaseReport* out);

NameEntry FromProto(const v1::NameEntry& entry);
LeaseGrant FromProto(const v1::LeaseGrant& grant);

std::vector<LeaseReport> FromProto(
    const google::protobuf::RepeatedPtrField<v1::LeaseReport>& reports);
std::vector<LeaseWant> FromProto(const google::protobuf::RepeatedPtrField<v1::LeaseWant>& wants);
std::vector<ObjectRef> FromProto(const google::protobuf::RepeatedPtrField<v1::ObjectRef>& objects);
// REQUIRES: validated (daemon/request_validation.h): offsets chunk-aligned
// within the largest heap.
std::vector<LargePlacement> FromProto(
    const google::protobuf::RepeatedPtrField<v1::LargePlacement>& placed);
void ToProto(const LargePlacement& placement, v1::LargePlacement* out);
// A sync's placed and released runs; a detach's placed.
ReserveReport ReserveReportOf(const v1::SyncRequest& request);
ReserveReport ReserveReportOf(const v1::DetachRequest& request);

}  // namespace heapd

#endif  // HEAPD_PROTOCOL_PROTO_CONVERT_H_
