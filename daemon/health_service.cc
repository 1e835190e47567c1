#include "daemon/health_service.h"

#include <chrono>
#include <thread>

namespace heapd {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthCheckResponse::ServingStatus HealthService::StatusOf(const std::string& service) const {
  if (!service.empty() && service != "heapd.v1.Heapd") return HealthCheckResponse::SERVICE_UNKNOWN;
  return shutting_down_ ? HealthCheckResponse::NOT_SERVING : HealthCheckResponse::SERVING;
}

grpc::Status HealthService::Check(grpc::ServerContext*, const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  const HealthCheckResponse::ServingStatus status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "unknown service '" + request->service() + "'");
  }
  response->set_status(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context, const HealthCheckRequest* request,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  HealthCheckResponse::ServingStatus last = HealthCheckResponse::UNKNOWN;
  while (!context->IsCancelled()) {
    const HealthCheckResponse::ServingStatus now = StatusOf(request->service());
    if (now != last) {
      HealthCheckResponse response;
      response.set_status(now);
      if (!writer->Write(response)) break;
      last = now;
    }
    if (shutting_down_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return grpc::Status::OK;
}

}  // namespace heapd
