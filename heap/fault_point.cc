#include "heap/fault_point.h"

#include <atomic>

namespace heapd {
namespace {
std::atomic<FaultHandler> g_handler{nullptr};
}  // namespace

void SetFaultHandler(FaultHandler handler) { g_handler.store(handler); }

void FaultPoint(const char* point) {
  if (FaultHandler handler = g_handler.load(std::memory_order_relaxed)) handler(point);
}

}  // namespace heapd
