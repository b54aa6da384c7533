// Which layers a stage's memory belongs to, read from the stage's own graph (issue 41).
//
// A stage's KV cache, recurrent state and DeepSeek V4's compressed caches and compressor state are
// tensors llama names after their layer ("cache_k_l3", "cache_s_l3", "dsv4_csa_state_kv_l3"): 0003
// allocates them for the owned layers only. The memory breakdown gives one total per buffer type, so
// a stage that allocates state for layers it does not own shows only as a sum too large, and which of
// the stages holds it cannot be told. This walks the graph the stage computes (llama_graph_reserve, the
// shape llama reserves at start) and counts every memory tensor a node reads, by the layer its name
// ends in; what the stage allocated but no node reads is the state no owned layer uses. Both are
// measured, not computed from the model's shape, so the certifier can compare each stage with the
// monolithic worker layer by layer and name the stage and the layers that differ. The same walk tells
// whether the graph names its layer outputs (captures, request_checks.h).
#pragma once

#include <cstdint>
#include <map>

struct llama_context;

namespace dgr {

struct MemoryLayers {
    std::map<int32_t, uint64_t> bytes_by_layer;  // memory the graph reads, by layer (-1: no layer in its name)
    int64_t unread_bytes = 0;                    // allocated memory that no node of the graph reads
    // The graph names its layers' outputs ("l_out-<il>"), which 0002's stage cut records as the next
    // layer's input: a capture of any layer after the first then has a tensor to read.
    bool names_layer_outputs = false;
};

// `allocated`: the context's memory bytes (llama_get_memory_breakdown's context, every buffer type).
// Reserves the context's graph for one full ubatch, as llama_init_from_model did: nothing grows.
MemoryLayers memory_layers(llama_context * ctx, uint64_t allocated);

}  // namespace dgr
