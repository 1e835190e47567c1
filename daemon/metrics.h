// Metrics: heapd's Prometheus endpoint (text exposition over HTTP).
#ifndef HEAPD_DAEMON_METRICS_H_
#define HEAPD_DAEMON_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace heapd {

inline constexpr char kVersion[] = "0.3.0";

class Metrics {
 public:
  // Serves metrics on `address` (HOST:PORT). UNAVAILABLE if it cannot bind.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& address);

  prometheus::Registry& registry() { return *registry_; }

 private:
  Metrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_METRICS_H_
