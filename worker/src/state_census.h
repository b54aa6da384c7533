// The state census (--census): how much of DeepSeek V4's compressed and sliding-window state the
// passes a worker computed actually filled, measured from the graph's own masks (issue 41).
//
// A certificate at depth claims that the run exercised the caches a long context fills: compressed
// entries in the ratio-4 (CSA) and ratio-128 (HCA) caches, lightning-indexer selections that left
// candidates out, a sliding window that wrapped. Positions alone say what should have been held; the
// census reads what each layer's attention could see. It is llama's eval callback on named nodes of
// the deepseek4 graph (the pinned tree's names, "<name>-<layer>"):
//   lid_score_masked  the indexer's scores over the CSA's compressed entries: finite = a candidate
//   csa_top_k_mask    the CSA mask after the top-k: finite = selected
//   csa_lid_kq_mask   [raw window | CSA] columns of a CSA layer's attention mask
//   hca_kq_mask       [raw window | HCA] columns of an HCA layer's attention mask
//   csa_comp_k / hca_comp_k, csa_raw_k / hca_raw_k   read at the ask only: their widths split the masks
// Each is read row by row (one row per token of the pass), and the worker keeps, per layer, maxima and
// counts over every pass of its life; Info reports them. Watching nodes splits the graph where they are
// computed (ggml_backend_sched), which the CPU lane computes bitwise the same; the worker without
// --census sets no callback. Other architectures name none of these nodes: their census stays empty.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

struct ggml_tensor;

namespace dgr {

struct LayerState {
    int32_t layer = -1;
    std::string kind;             // "csa" (compressed, indexed) or "hca" (heavily compressed)
    int64_t entries_held = 0;     // most compressed entries one row could attend to (csa: its candidates)
    int64_t rows = 0;             // token rows observed (every pass's)
    int64_t candidates_max = 0;   // csa: the most indexer candidates in one row
    int64_t selected_at_max = 0;  // csa: how many the indexer selected in that row
    int64_t excluding_rows = 0;   // csa: rows where the selection left candidates out
    int64_t window_max = 0;       // the most raw (sliding-window) entries one row saw
    int64_t raw_cells = 0;        // the raw cache's cells the layer's attention viewed
};

class StateCensus {
public:
    // llama_context_params::cb_eval with this census as the user data.
    static bool observe(ggml_tensor * t, bool ask, void * census);
    std::vector<LayerState> snapshot() const;  // by layer; safe from any thread

private:
    bool wants(const ggml_tensor * t);  // ask phase: widths are noted here
    void read(const ggml_tensor * t);
    LayerState & layer(int32_t il, const char * kind);
    void read_candidates(const ggml_tensor * t, int32_t il);
    void read_selected(const ggml_tensor * t, int32_t il);
    void read_mask(const ggml_tensor * t, int32_t il, const char * kind);

    mutable std::mutex mu_;
    std::map<int32_t, LayerState> layers_;
    std::map<int32_t, std::vector<long>> candidates_;  // the last pass's candidates per row, per CSA layer
    std::map<std::string, int64_t> widths_;            // "csa_comp_k-3" -> its entries, from the ask
    std::vector<char> staging_;
};

}  // namespace dgr
