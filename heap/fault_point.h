// Fault points: named places in the persistence code where a test can stop
// the process (SIGKILL) to prove that every crash point recovers. In
// production no handler is installed and a fault point is one atomic load.
#ifndef HEAPD_HEAP_FAULT_POINT_H_
#define HEAPD_HEAP_FAULT_POINT_H_

namespace heapd {

// Called with the fault point's name each time one is reached.
using FaultHandler = void (*)(const char* point);

// Installs `handler` (nullptr removes it). Tests only.
void SetFaultHandler(FaultHandler handler);

// Reports reaching the fault point `point` to the installed handler, if any.
void FaultPoint(const char* point);

}  // namespace heapd

#endif  // HEAPD_HEAP_FAULT_POINT_H_
