// A computed tensor's values row by row, whatever its strides (it may be a view) and its backend: what
// an eval callback reads of a graph node (the top-k probe's selection inputs, the state census's masks).
#pragma once

#include <cstddef>
#include <vector>

struct ggml_tensor;

namespace dgr {

// Rows of ne[0] values, ordered i1 fastest, then i2, then i3. F32 and F16 only (throws otherwise).
// ``staging`` holds the tensor's bytes between calls, so a callback reuses one buffer.
std::vector<std::vector<float>> read_rows(const ggml_tensor * t, std::vector<char> & staging);

// How many values of ``row`` in [begin, end) are finite (a mask's visible entries: the rest are -inf).
long count_finite(const std::vector<float> & row, std::size_t begin, std::size_t end);

}  // namespace dgr
