// The plugin buffers this process holds, as the plugin reports them: a
// check that storages and donation leave no second buffer behind.
#pragma once

#include <cstdint>

#include "pjrt/pjrt.h"

namespace torch_tpu::pjrt {

struct LiveBufferStats {
  int64_t count = 0;
  int64_t bytes = 0;  // PJRT_Buffer_OnDeviceSizeInBytes, summed
};

// Buffer objects alive on `device` and not deleted by a donation.
// O(live buffers), under a lock: for tests and benchmarks, not per op.
LiveBufferStats LiveBuffers(PJRT_Device* device);

}  // namespace torch_tpu::pjrt
