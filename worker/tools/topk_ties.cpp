// dgr-topk-ties: which candidates ggml_top_k keeps when values tie at the selection boundary, on
// every backend device this ggml was built with. Pure ggml, no model.
//
//   dgr-topk-ties
//
// Each row below has more candidates with the k-th largest value than slots left for them, so any
// choice among the tied ones is a valid top-k; the program prints which one each backend makes, in
// the order the op returns them, and whether the backends' sets differ. A last block shows what
// ggml-cuda's bitonic argsort (k_argsort_f32_i32, its top_k fallback below CCCL 3.2) would select,
// computed by a host port of that sorting network: it is labelled as such and is not a device run.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr int N_COLS = 16;
constexpr int K = 4;
constexpr float NEG_INF = -INFINITY;

using Row = std::vector<float>;
using Selection = std::vector<std::vector<int>>;  // per row, the indices top_k returned

// Rows of one [N_COLS, n_rows] input.
std::vector<Row> tie_rows() {
    Row masked(N_COLS, NEG_INF);  // an indexer row: 7 visible blocks, 3 of them scored exactly 0
    const float visible[] = {0.12f, 0.0f, 0.09f, 0.0f, 0.0f, 0.03f, -0.05f};
    std::copy(std::begin(visible), std::end(visible), masked.begin());
    Row zeros(N_COLS, 0.0f);     // every candidate tied
    Row plateau(N_COLS, -1.0f);  // one clear winner, then 6 tied for 3 slots
    plateau[0] = 0.5f;
    std::fill(plateau.begin() + 3, plateau.begin() + 9, 0.25f);
    Row late(N_COLS, 0.0f);  // the tied first K, then one larger value: which tied one makes room?
    late[K] = 1.0f;
    return {masked, zeros, plateau, late};
}

std::string format_value(float v) {
    if (std::isinf(v)) {
        return v < 0 ? "-inf" : "inf";
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", v);
    return buf;
}

std::string join(const std::vector<int> & xs, const char * sep) {
    std::string out;
    for (size_t i = 0; i < xs.size(); ++i) {
        out += (i ? sep : "") + std::to_string(xs[i]);
    }
    return out;
}

std::vector<int> as_set(std::vector<int> xs) {
    std::sort(xs.begin(), xs.end());
    return xs;
}

// ggml_top_k of the rows on one device; false (with a reason) when the device cannot run it.
bool run_top_k(ggml_backend_dev_t dev, const std::vector<Row> & rows, Selection & out, std::string & why) {
    const ggml_init_params ip = {ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, N_COLS, (int64_t) rows.size());
    ggml_tensor * y = ggml_top_k(ctx, x, K);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);

    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    ggml_backend_buffer_t buf = nullptr;
    bool ok = false;
    if (backend == nullptr) {
        why = "device init failed";
    } else if (!ggml_backend_supports_op(backend, y)) {
        why = "top_k not supported";
    } else if ((buf = ggml_backend_alloc_ctx_tensors(ctx, backend)) == nullptr) {
        why = "buffer allocation failed";
    } else {
        for (size_t r = 0; r < rows.size(); ++r) {
            ggml_backend_tensor_set(x, rows[r].data(), r * x->nb[1], N_COLS * sizeof(float));
        }
        ok = ggml_backend_graph_compute(backend, gf) == GGML_STATUS_SUCCESS;
        why = ok ? "" : "graph compute failed";
    }
    if (ok) {
        out.assign(rows.size(), std::vector<int>(K));
        for (size_t r = 0; r < rows.size(); ++r) {
            ggml_backend_tensor_get(y, out[r].data(), r * y->nb[1], K * sizeof(int32_t));
        }
    }
    ggml_backend_buffer_free(buf);
    ggml_backend_free(backend);
    ggml_free(ctx);
    return ok;
}

// Host port of ggml-cuda's k_argsort_f32_i32<GGML_SORT_ORDER_DESC> (ggml/src/ggml-cuda/argsort.cu):
// each (k, j) stage compares disjoint pairs, so running the threads one after another is exact.
std::vector<int> cuda_bitonic_desc(const Row & x, int k) {
    const int ncols = (int) x.size();
    int ncols_pad = 1;
    while (ncols_pad < ncols) {
        ncols_pad *= 2;
    }
    std::vector<int> idx(ncols_pad);
    for (int c = 0; c < ncols_pad; ++c) {
        idx[c] = c;
    }
    for (int kk = 2; kk <= ncols_pad; kk *= 2) {
        for (int j = kk / 2; j > 0; j /= 2) {
            for (int col = 0; col < ncols_pad; ++col) {
                const int ixj = col ^ j;
                if (ixj <= col) {
                    continue;
                }
                const bool swap = (col & kk) == 0
                                      ? idx[col] >= ncols || (idx[ixj] < ncols && x[idx[col]] < x[idx[ixj]])
                                      : idx[ixj] >= ncols || (idx[col] < ncols && x[idx[col]] > x[idx[ixj]]);
                if (swap) {
                    std::swap(idx[col], idx[ixj]);
                }
            }
        }
    }
    return {idx.begin(), idx.begin() + k};
}

void print_rows(const std::vector<Row> & rows) {
    std::printf("ggml_top_k, k=%d, %zu rows of %d candidates:\n", K, rows.size(), N_COLS);
    for (size_t r = 0; r < rows.size(); ++r) {
        std::string line;
        for (float v : rows[r]) {
            line += " " + format_value(v);
        }
        std::printf("  row %zu:%s\n", r, line.c_str());
    }
}

void print_selection(const std::string & who, const Selection & sel) {
    for (size_t r = 0; r < sel.size(); ++r) {
        std::printf("%s: row %zu -> %s  (set {%s})\n", who.c_str(), r, join(sel[r], " ").c_str(),
                    join(as_set(sel[r]), ",").c_str());
    }
}

// One line per row: do all backends keep the same set?
void print_agreement(const std::map<std::string, Selection> & by_device, size_t n_rows) {
    for (size_t r = 0; r < n_rows; ++r) {
        std::set<std::vector<int>> sets;
        std::string detail;
        for (const auto & [who, sel] : by_device) {
            sets.insert(as_set(sel[r]));
            detail += " " + who + "={" + join(as_set(sel[r]), ",") + "}";
        }
        std::printf("row %zu: %s across %zu backend(s):%s\n", r, sets.size() <= 1 ? "same set" : "SETS DIFFER",
                    by_device.size(), detail.c_str());
    }
}

}  // namespace

int main() {
    const auto rows = tie_rows();
    print_rows(rows);
    std::map<std::string, Selection> by_device;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const std::string who = ggml_backend_dev_name(dev);
        Selection sel;
        std::string why;
        if (!run_top_k(dev, rows, sel, why)) {
            std::printf("%s (%s): skipped: %s\n", who.c_str(), ggml_backend_dev_description(dev), why.c_str());
            continue;
        }
        std::printf("%s (%s):\n", who.c_str(), ggml_backend_dev_description(dev));
        print_selection(who, sel);
        by_device[who] = sel;
    }
    print_agreement(by_device, rows.size());

    Selection port;
    for (const auto & row : rows) {
        port.push_back(cuda_bitonic_desc(row, K));
    }
    std::printf("host port of ggml-cuda k_argsort_f32_i32 (bitonic fallback; not a device run):\n");
    print_selection("cuda-bitonic-port", port);
    return by_device.empty() ? 1 : 0;
}
