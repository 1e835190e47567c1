#include "daemon/metrics.h"

#include <exception>

#include "prometheus/gauge.h"

namespace heapd {

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& address) {
  std::unique_ptr<Metrics> metrics(new Metrics);
  metrics->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("heapd_build_info")
      .Help("heapd's version; always 1")
      .Register(*metrics->registry_)
      .Add({{"version", kVersion}})
      .Set(1);
  try {
    metrics->exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
  metrics->exposer_->RegisterCollectable(metrics->registry_);
  return metrics;
}

}  // namespace heapd
