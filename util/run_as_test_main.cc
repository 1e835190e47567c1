// main() for a GoogleTest binary whose code calls RunAs: the binary is then
// its own helper (util/run_as.h).
#include "gtest/gtest.h"
#include "util/run_as.h"

int main(int argc, char** argv) {
  if (heapd::StartedAsRunAsHelper(argc, argv)) return heapd::RunAsHelperMain();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
