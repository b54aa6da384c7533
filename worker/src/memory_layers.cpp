#include "memory_layers.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-ext.h"  // staging API of the pinned tree: llama_graph_reserve

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <unordered_set>
#include <vector>

namespace dgr {

namespace {

// A tensor of the context's memory: its own storage (not a view) in a buffer that holds neither
// weights nor the compute graph's intermediates.
bool is_memory(const ggml_tensor * t) {
    return t->view_src == nullptr && t->buffer != nullptr &&
           ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_ANY;
}

// The layer a memory tensor's name ends in ("cache_k_l12" -> 12); -1 when it names none.
int32_t layer_of(const char * name) {
    const char * mark = strrchr(name, 'l');
    if (mark == nullptr || mark == name || mark[-1] != '_' || mark[1] == '\0') {
        return -1;
    }
    char * end = nullptr;
    const long il = strtol(mark + 1, &end, 10);
    return *end == '\0' ? static_cast<int32_t>(il) : -1;
}

// The bytes a tensor takes in its buffer, as ggml_backend_alloc_ctx_tensors_from_buft places it.
uint64_t allocated_bytes(ggml_tensor * t) {
    const size_t align = ggml_backend_buffer_get_alignment(t->buffer);
    return GGML_PAD(ggml_backend_buffer_get_alloc_size(t->buffer, t), align);
}

// Every tensor a node reads, through its sources and the tensors its views look into.
std::vector<ggml_tensor *> memory_read_by(ggml_cgraph * gf) {
    std::unordered_set<const ggml_tensor *> seen;
    std::vector<ggml_tensor *> stack;
    std::vector<ggml_tensor *> found;
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        stack.push_back(ggml_graph_node(gf, i));
    }
    while (!stack.empty()) {
        ggml_tensor * t = stack.back();
        stack.pop_back();
        if (t == nullptr || !seen.insert(t).second) {
            continue;
        }
        if (is_memory(t)) {
            found.push_back(t);
        }
        stack.push_back(t->view_src);
        for (ggml_tensor * src : t->src) {
            stack.push_back(src);
        }
    }
    return found;
}

}  // namespace

MemoryLayers memory_layers(llama_context * ctx, uint64_t allocated) {
    const uint32_t n_tokens = llama_n_ubatch(ctx);
    ggml_cgraph * gf = llama_graph_reserve(ctx, n_tokens, 1, n_tokens);
    if (gf == nullptr) {
        throw std::runtime_error("could not reserve the stage's graph to account its memory by layer");
    }
    MemoryLayers out;
    for (int i = 0; i < ggml_graph_n_nodes(gf) && !out.names_layer_outputs; ++i) {
        out.names_layer_outputs = strncmp(ggml_get_name(ggml_graph_node(gf, i)), "l_out-", 6) == 0;
    }
    uint64_t read = 0;
    for (ggml_tensor * t : memory_read_by(gf)) {
        const uint64_t bytes = allocated_bytes(t);
        out.bytes_by_layer[layer_of(ggml_get_name(t))] += bytes;
        read += bytes;
    }
    out.unread_bytes = static_cast<int64_t>(allocated) - static_cast<int64_t>(read);
    return out;
}

}  // namespace dgr
