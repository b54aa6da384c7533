// The greedy pick by numpy's rule, on its own so the ring and its probe (tools/argmax_probe.cpp, held
// to numpy.argmax by tests/integration/test_argmax_probe.py) share it without gRPC.
#pragma once

#include <cstdint>

namespace dgr {

// numpy.argmax's rule on one row: the first index of the maximum, or the first NaN if there is one.
int32_t greedy_token(const float * row, int64_t n);

}  // namespace dgr
