#include "state_census.h"

#include "ggml.h"
#include "tensor_rows.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dgr {
namespace {

// "<name>-<layer>" as llama's graph callback names a layer's node; false for any other name.
bool split_name(const char * full, std::string & name, int32_t & il) {
    const char * dash = std::strrchr(full, '-');
    if (dash == nullptr || dash[1] < '0' || dash[1] > '9') {
        return false;
    }
    name.assign(full, (size_t) (dash - full));
    il = (int32_t) std::atoi(dash + 1);
    return true;
}

bool is_read(const std::string & name) {
    return name == "lid_score_masked" || name == "csa_top_k_mask" || name == "csa_lid_kq_mask" || name == "hca_kq_mask";
}

bool is_width(const std::string & name) {
    return name == "csa_comp_k" || name == "hca_comp_k" || name == "csa_raw_k" || name == "hca_raw_k";
}

}  // namespace

bool StateCensus::observe(ggml_tensor * t, bool ask, void * census) {
    auto & self = *static_cast<StateCensus *>(census);
    if (ask) {
        return self.wants(t);
    }
    self.read(t);
    return true;  // false would stop the graph
}

bool StateCensus::wants(const ggml_tensor * t) {
    std::string name;
    int32_t il = -1;
    if (!split_name(t->name, name, il)) {
        return false;
    }
    if (is_width(name)) {
        widths_[t->name] = t->ne[2];  // [head dim, heads, entries, streams]: the entries in view
        return false;
    }
    return is_read(name);
}

void StateCensus::read(const ggml_tensor * t) {
    std::string name;
    int32_t il = -1;
    split_name(t->name, name, il);
    std::lock_guard<std::mutex> lock(mu_);
    if (name == "lid_score_masked") {
        read_candidates(t, il);
    } else if (name == "csa_top_k_mask") {
        read_selected(t, il);
    } else {
        read_mask(t, il, name == "hca_kq_mask" ? "hca" : "csa");
    }
}

LayerState & StateCensus::layer(int32_t il, const char * kind) {
    LayerState & s = layers_[il];
    s.layer = il;
    s.kind = kind;
    return s;
}

// The indexer's candidates: every compressed CSA entry a row may see (the rest are masked to -inf).
void StateCensus::read_candidates(const ggml_tensor * t, int32_t il) {
    std::vector<long> & counts = candidates_[il];
    counts.clear();
    for (const auto & row : read_rows(t, staging_)) {
        counts.push_back(count_finite(row, 0, row.size()));
    }
}

// The selection, paired row by row with the same layer's candidates of this pass.
void StateCensus::read_selected(const ggml_tensor * t, int32_t il) {
    LayerState & s = layer(il, "csa");
    const std::vector<long> & candidates = candidates_[il];
    const auto rows = read_rows(t, staging_);
    for (size_t r = 0; r < rows.size() && r < candidates.size(); ++r) {
        const long selected = count_finite(rows[r], 0, rows[r].size());
        s.excluding_rows += selected < candidates[r] ? 1 : 0;
        if (candidates[r] > s.candidates_max) {
            s.candidates_max = candidates[r];
            s.selected_at_max = selected;
            s.entries_held = candidates[r];  // every compressed entry is a candidate; the mask shows the selected
        }
    }
}

// A layer's attention mask: its first columns the raw window's cells, the rest its compressed entries
// (an HCA layer's: every one it holds; a CSA layer's: the indexer's selection, counted above).
void StateCensus::read_mask(const ggml_tensor * t, int32_t il, const char * kind) {
    LayerState & s = layer(il, kind);
    const std::string layer_name = "-" + std::to_string(il);
    const int64_t raw = widths_[std::string(kind) + "_raw_k" + layer_name];
    const auto rows = read_rows(t, staging_);
    for (const auto & row : rows) {
        const size_t split = std::min((size_t) raw, row.size());
        s.window_max = std::max<int64_t>(s.window_max, count_finite(row, 0, split));
        if (s.kind == "hca") {
            s.entries_held = std::max<int64_t>(s.entries_held, count_finite(row, split, row.size()));
        }
    }
    s.rows += (int64_t) rows.size();
    s.raw_cells = std::max(s.raw_cells, raw);
}

std::vector<LayerState> StateCensus::snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<LayerState> out;
    for (const auto & [il, s] : layers_) {
        out.push_back(s);
    }
    return out;
}

}  // namespace dgr
