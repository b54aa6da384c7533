#include "argmax.h"

#include <cmath>

namespace dgr {

namespace {

// True when ``row`` holds a NaN (an integer OR the compiler vectorises).
bool any_nan(const float * row, int64_t n) {
    int nan = 0;
    for (int64_t i = 0; i < n; ++i) {
        nan |= !(row[i] == row[i]);
    }
    return nan != 0;
}

// The maximum of a NaN-free row. Without leave to ignore NaNs and the sign of zero GCC keeps this
// reduction scalar; neither can change the result here (no NaN is left, and the caller looks for the
// first element equal to the maximum, where -0 == +0), so the function alone gets that leave.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("finite-math-only", "no-signed-zeros")))
#endif
float max_of(const float * row, int64_t n) {
    float best = row[0];
    for (int64_t i = 1; i < n; ++i) {
        best = row[i] > best ? row[i] : best;
    }
    return best;
}

}  // namespace

int32_t greedy_token(const float * row, int64_t n) {
    // numpy's rule in passes the compiler vectorises (one branchy pass over a 32k-129k vocabulary was
    // 2.5% of a monolithic worker's decode time under perf): a NaN first, else the first maximum
    if (n <= 0) {
        return 0;
    }
    if (any_nan(row, n)) {
        for (int64_t i = 0; i < n; ++i) {
            if (std::isnan(row[i])) {
                return (int32_t) i;  // numpy: a NaN is the maximum, the first one wins
            }
        }
    }
    const float best = max_of(row, n);
    for (int64_t i = 0; i < n; ++i) {
        if (row[i] == best) {
            return (int32_t) i;  // the first of equal maxima
        }
    }
    return 0;
}

}  // namespace dgr
