// Metrics without a server: what each count adds to the exposition, series
// that exist at 0 from the start (so rates and alerts work before the first
// event), heaps forgotten, and the metrics address rules.
#include "daemon/metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace heapd {
namespace {

std::string Exposition(Metrics& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.registry().Collect());
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, SeriesThatAlertsWatchExistAtZeroFromTheStart) {
  Metrics metrics;
  const std::string text = Exposition(metrics);
  EXPECT_TRUE(Has(text, "heapd_sessions_reclaimed_total{reason=\"connection_closed\"} 0")) << text;
  EXPECT_TRUE(Has(text, "heapd_snapshots_total{outcome=\"failed\"} 0"));
  EXPECT_TRUE(Has(text, "heapd_store_restores_total{outcome=\"failed\"} 0"));
  EXPECT_TRUE(Has(text, "heapd_frees_rejected_total{code=\"INVALID_ARGUMENT\"} 0"));
  EXPECT_NE(text.find("heapd_build_info{"), std::string::npos);
}

TEST(MetricsTest, EachCountLandsInItsSeries) {
  Metrics metrics;
  metrics.CountCall("Attach", absl::OkStatus(), 0.001);
  metrics.CountCall("Attach", absl::NotFoundError("no heap"), 0.002);
  metrics.CountCall("Attach", absl::NotFoundError("no heap"), 0.002);
  metrics.CountReclaim("token_expired", 3, 1);
  metrics.CountRejectedFree(absl::InvalidArgumentError("double free"));
  metrics.CountSnapshot(absl::OkStatus(), 0.5, 4096);
  metrics.CountSnapshot(absl::InternalError("disk"), 0.1, 0);
  const std::string text = Exposition(metrics);
  EXPECT_TRUE(Has(text, "heapd_rpc_calls_total{code=\"OK\",method=\"Attach\"} 1")) << text;
  EXPECT_TRUE(Has(text, "heapd_rpc_calls_total{code=\"NOT_FOUND\",method=\"Attach\"} 2"));
  EXPECT_TRUE(Has(text, "heapd_rpc_duration_seconds_count{method=\"Attach\"} 3"));
  EXPECT_TRUE(Has(text, "heapd_sessions_reclaimed_total{reason=\"token_expired\"} 1"));
  EXPECT_TRUE(Has(text, "heapd_leases_reclaimed_total 3"));
  EXPECT_TRUE(Has(text, "heapd_large_objects_reclaimed_total 1"));
  EXPECT_TRUE(Has(text, "heapd_frees_rejected_total{code=\"INVALID_ARGUMENT\"} 1"));
  EXPECT_TRUE(Has(text, "heapd_snapshots_total{outcome=\"ok\"} 1"));
  EXPECT_TRUE(Has(text, "heapd_snapshots_total{outcome=\"failed\"} 1"));
  EXPECT_TRUE(Has(text, "heapd_snapshot_bytes_written_total 4096"));
}

TEST(MetricsTest, AHeapsSeriesGoWithTheHeap) {
  Metrics metrics;
  metrics.CountSync("graph", absl::OkStatus(), 0.01);
  metrics.CountSync("graph", absl::DataLossError("fdatasync"), 0.01);
  metrics.CountSync("other", absl::OkStatus(), 0.01);
  std::string text = Exposition(metrics);
  EXPECT_TRUE(Has(text, "heapd_sync_failures_total{heap=\"graph\"} 1")) << text;
  // One histogram for the node: the two syncs that succeeded.
  EXPECT_TRUE(Has(text, "heapd_sync_duration_seconds_count 2")) << text;
  metrics.ForgetHeap("graph");
  metrics.ForgetHeap("never-there");
  text = Exposition(metrics);
  EXPECT_EQ(text.find("heap=\"graph\""), std::string::npos) << text;
  EXPECT_TRUE(Has(text, "heapd_sync_failures_total{heap=\"other\"} 0"));
}

TEST(MetricsTest, APortAloneMeansLoopbackAndBadAddressesAreRefused) {
  EXPECT_EQ(MetricsBindAddress(":9464"), "127.0.0.1:9464");
  EXPECT_EQ(MetricsBindAddress("0.0.0.0:9464"), "0.0.0.0:9464");
  EXPECT_TRUE(CheckMetricsAddress(":9464").ok());
  EXPECT_TRUE(CheckMetricsAddress("[::1]:9464").ok());
  for (const char* bad : {"9464", ":", ":port", ":70000", "localhost"}) {
    const absl::Status status = CheckMetricsAddress(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("--metrics_address"), absl::string_view::npos) << status;
  }
}

}  // namespace
}  // namespace heapd
