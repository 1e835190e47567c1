#include "protocol/proto_convert.h"

#include "allocator/size_class.h"

namespace heapd {

v1::BackingKind ToProto(BackingKind kind) {
  switch (kind) {
    case BackingKind::kDax:
      return v1::BACKING_DAX;
    case BackingKind::kTmpfs:
      return v1::BACKING_TMPFS;
    case BackingKind::kFile:
      return v1::BACKING_FILE;
  }
  return v1::BACKING_UNKNOWN;
}

void ToProto(const NameEntry& entry, v1::NameEntry* out) {
  out->set_name(entry.name);
  out->set_offset(entry.offset);
  out->set_size(entry.size);
  out->set_type_name(entry.type_name);
  out->set_owner_uid(entry.owner_uid);
  out->set_created_unix_ns(entry.created_unix_ns);
}

void ToProto(const LeaseGrant& grant, v1::LeaseGrant* out) {
  out->set_chunk(grant.chunk);
  out->set_size_class(grant.size_class);
  out->mutable_words()->Add(grant.words.begin(), grant.words.end());
}

void ToProto(const LeaseCorrection& correction, v1::LeaseCorrection* out) {
  out->set_chunk(correction.chunk);
  out->mutable_freed_slots()->Add(correction.freed_slots.begin(), correction.freed_slots.end());
  out->mutable_kept_slots()->Add(correction.kept_slots.begin(), correction.kept_slots.end());
}

void ToProto(const LeaseReport& report, v1::LeaseReport* out) {
  out->set_chunk(report.chunk);
  out->mutable_words()->Add(report.words.begin(), report.words.end());
  if (report.size_class >= 0) out->set_size_class(static_cast<uint32_t>(report.size_class));
}

NameEntry FromProto(const v1::NameEntry& entry) {
  return {entry.name(),      entry.offset(),    entry.size(),
          entry.type_name(), entry.owner_uid(), entry.created_unix_ns()};
}

LeaseGrant FromProto(const v1::LeaseGrant& grant) {
  return {grant.chunk(), grant.size_class(), {grant.words().begin(), grant.words().end()}};
}

std::vector<LeaseReport> FromProto(
    const google::protobuf::RepeatedPtrField<v1::LeaseReport>& reports) {
  std::vector<LeaseReport> out;
  out.reserve(reports.size());
  for (const v1::LeaseReport& report : reports) {
    out.push_back({report.chunk(),
                   {report.words().begin(), report.words().end()},
                   report.has_size_class() && report.size_class() < kNumSizeClasses
                       ? static_cast<int32_t>(report.size_class())
                       : (report.has_size_class() ? static_cast<int32_t>(kNumSizeClasses) : -1)});
  }
  return out;
}

std::vector<LeaseWant> FromProto(const google::protobuf::RepeatedPtrField<v1::LeaseWant>& wants) {
  std::vector<LeaseWant> out;
  out.reserve(wants.size());
  for (const v1::LeaseWant& want : wants) {
    out.push_back({want.size_class(), want.count(), {want.reuse().begin(), want.reuse().end()}});
  }
  return out;
}

std::vector<ObjectRef> FromProto(const google::protobuf::RepeatedPtrField<v1::ObjectRef>& objects) {
  std::vector<ObjectRef> out;
  out.reserve(objects.size());
  for (const v1::ObjectRef& object : objects) out.push_back({object.offset(), object.size()});
  return out;
}

std::vector<LargePlacement> FromProto(
    const google::protobuf::RepeatedPtrField<v1::LargePlacement>& placed) {
  std::vector<LargePlacement> out;
  out.reserve(placed.size());
  for (const v1::LargePlacement& p : placed) {
    out.push_back({static_cast<uint32_t>(p.offset() >> kChunkShift), p.chunks(), p.again()});
  }
  return out;
}

ReserveReport ReserveReportOf(const v1::SyncRequest& request) {
  return {FromProto(request.placed()), FromProto(request.released())};
}

ReserveReport ReserveReportOf(const v1::DetachRequest& request) {
  return {FromProto(request.placed()), {}};
}

void ToProto(const LargePlacement& placement, v1::LargePlacement* out) {
  out->set_offset(uint64_t{placement.chunk} << kChunkShift);
  out->set_chunks(placement.chunks);
  out->set_again(placement.again);
}

}  // namespace heapd
