// The bytes of one number as an element of a given type: what a rank-0
// parameter buffer holds. Integers wrap like C++ casts, floats round to the
// nearest representable value (ties to even); float8_e4m3fn, which has no
// infinity, saturates at +-448 as PyTorch's conversion does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "hlo/element_type.h"

namespace torch_tpu::runtime {

struct ScalarBytes {
  uint8_t data[8] = {0};
  size_t size = 0;
};

ScalarBytes EncodeScalar(double v, hlo::ElementType t);
ScalarBytes EncodeScalar(int64_t v, hlo::ElementType t);

}  // namespace torch_tpu::runtime
