// raw_pointers: libstdc++ containers with plain pointers in a fixed-address
// heap (heapd::raw_allocator). `write` builds a catalog in the heap and
// names it; `read`, in another process, attaches the heap, checks the
// catalog through the same plain pointers and adds to it.
//
//   raw_pointers [--socket=PATH] [--heap=catalog] [--entries=1000] write|read
#include <cstdio>

#include "absl/flags/flag.h"
#include "client/examples/raw_catalog.h"
#include "heapd/client.h"
#include "heapd/heap.h"
#include "protocol/version.h"
#include "util/program_flags.h"

ABSL_FLAG(std::string, socket, "", "heapd's socket (default: $HEAPD_SOCKET or heapd's default)");
ABSL_FLAG(std::string, heap, "catalog", "fixed-address heap to attach (created if missing)");
ABSL_FLAG(uint64_t, entries, 1000, "catalog entries");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "raw_pointers: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> positional = heapd::ParseProgramFlags(
      argc, argv,
      "raw_pointers: std containers with plain pointers in a fixed-address heap\n"
      "usage: raw_pointers [--socket=PATH] [--heap=catalog] [--entries=1000] write|read",
      heapd::kHeapdVersion);
  const std::string mode = positional.size() == 2 ? positional[1] : "";
  if (mode != "write" && mode != "read") return Fail("say write or read (see --help)");
  auto client = heapd::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Fail(client.status().ToString());
  heapd::AttachOptions options;
  options.create_if_missing = mode == "write";
  options.fixed_address = true;
  auto attached = (*client)->Attach(absl::GetFlag(FLAGS_heap), options);
  if (!attached.ok()) return Fail(attached.status().ToString());
  heapd::Heap& heap = **attached;
  const uint64_t entries = absl::GetFlag(FLAGS_entries);
  try {
    if (mode == "write") {
      auto catalog = heap.construct<heapd::RawCatalog>("catalog")(heapd::Raw<char>(heap));
      if (!catalog.ok()) return Fail(catalog.status().ToString());
      heapd::FillRawCatalog(heap, **catalog, entries);
    } else {
      auto catalog = heap.find<heapd::RawCatalog>("catalog");
      if (!catalog.ok()) return Fail(catalog.status().ToString());
      if (std::string wrong = heapd::CheckRawCatalog(**catalog, entries); !wrong.empty()) {
        return Fail(wrong);
      }
      // Allocates in this process's session, through the allocator the
      // writer stored in the heap.
      (*catalog)->title += ", read in another process";
    }
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  if (absl::Status s = heap.detach(); !s.ok()) return Fail(s.ToString());
  std::printf("%s ok: heap %s at %p\n", mode.c_str(), heap.name().c_str(),
              static_cast<void*>(heap.base()));
  return 0;
}
