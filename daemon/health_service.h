// HealthService: grpc.health.v1.Health for the daemon. "" and "heapd.v1.Heapd"
// are SERVING until the daemon starts shutting down, NOT_SERVING after;
// other names are NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch).
#ifndef HEAPD_DAEMON_HEALTH_SERVICE_H_
#define HEAPD_DAEMON_HEALTH_SERVICE_H_

#include <atomic>

#include "proto/health.grpc.pb.h"

namespace heapd {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // From now on, report NOT_SERVING; Watch streams end.
  void SetShuttingDown() { shutting_down_ = true; }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  grpc::health::v1::HealthCheckResponse::ServingStatus StatusOf(const std::string& service) const;

  std::atomic<bool> shutting_down_{false};
};

}  // namespace heapd

#endif  // HEAPD_DAEMON_HEALTH_SERVICE_H_
