#include "tensor_rows.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dgr {

std::vector<std::vector<float>> read_rows(const ggml_tensor * t, std::vector<char> & staging) {
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) {
        throw std::runtime_error(std::string("tensor ") + t->name + " is " + ggml_type_name(t->type));
    }
    staging.resize(ggml_nbytes(t));
    ggml_backend_tensor_get(t, staging.data(), 0, staging.size());
    std::vector<std::vector<float>> rows;
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
                std::vector<float> row((size_t) t->ne[0]);
                for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
                    const char * at = staging.data() + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                    row[(size_t) i0] =
                        t->type == GGML_TYPE_F32 ? *(const float *) at : ggml_fp16_to_fp32(*(const ggml_fp16_t *) at);
                }
                rows.push_back(std::move(row));
            }
        }
    }
    return rows;
}

long count_finite(const std::vector<float> & row, size_t begin, size_t end) {
    long n = 0;
    for (size_t i = begin; i < end && i < row.size(); ++i) {
        n += std::isfinite(row[i]) ? 1 : 0;
    }
    return n;
}

}  // namespace dgr
