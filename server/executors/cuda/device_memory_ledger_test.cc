#include "server/executors/cuda/device_memory_ledger.h"

#include "gtest/gtest.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"

namespace probesidecar::server {
namespace {

TEST(DeviceMemoryLedgerTest, FreesHereWithoutAPool) {
  DeviceMemoryLedger ledger;
  const std::thread::id here = std::this_thread::get_id();
  std::thread::id ran_on;
  ledger.Free([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, here);
}

TEST(DeviceMemoryLedgerTest, FreesOnWorkerZeroOfThePool) {
  WorkerPool pool(2, 16);
  DeviceMemoryLedger ledger;
  ledger.FreeOn(&pool);
  absl::Notification freed;
  std::thread::id ran_on;
  ledger.Free([&] {
    ran_on = std::this_thread::get_id();
    freed.Notify();
  });
  freed.WaitForNotification();
  EXPECT_NE(ran_on, std::this_thread::get_id());
  ledger.FreeOn(nullptr);
  pool.Shutdown();
}

TEST(DeviceMemoryLedgerTest, FreesNothingOnceAbandoned) {
  DeviceMemoryLedger ledger;
  ledger.Abandon();
  bool ran = false;
  ledger.Free([&] { ran = true; });
  EXPECT_FALSE(ran);
}

TEST(DeviceMemoryLedgerTest, CountsBytes) {
  DeviceMemoryLedger ledger;
  ledger.bytes() += 100;
  ledger.bytes() -= 30;
  EXPECT_EQ(ledger.held(), 70);
}

}  // namespace
}  // namespace probesidecar::server
