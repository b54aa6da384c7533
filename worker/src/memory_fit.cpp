#include "memory_fit.h"

#include "llama-ext.h"

#include <fstream>
#include <map>
#include <sstream>

namespace dgr {

int64_t host_available_bytes() {
    std::ifstream meminfo("/proc/meminfo");
    std::string line;
    while (std::getline(meminfo, line)) {
        std::istringstream words(line);
        std::string key;
        int64_t kib = -1;
        if (words >> key >> kib && key == "MemAvailable:") {
            return kib * 1024;
        }
    }
    return -1;
}

namespace {

struct Held {
    uint64_t kv = 0;
    uint64_t compute = 0;
    int64_t free = -1;  // -1: unknown, no check
};

// Host buffers (the CPU device's, pinned host memory) share one pool: the host's available memory.
std::string place_of(ggml_backend_buffer_type_t buft) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr || ggml_backend_buft_is_host(buft) ||
        ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        return "host memory";
    }
    return ggml_backend_dev_name(dev);
}

int64_t free_at(ggml_backend_buffer_type_t buft, const std::string & place) {
    if (place == "host memory") {
        return host_available_bytes();
    }
    size_t free = 0;
    size_t total = 0;
    ggml_backend_dev_memory(ggml_backend_buft_get_device(buft), &free, &total);
    return (int64_t) free;
}

std::map<std::string, Held> simulated(llama_context * ctx) {
    std::map<std::string, Held> by_place;
    for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
        const std::string place = place_of(buft);
        Held & h = by_place[place];
        h.kv += mb.context;
        h.compute += mb.compute;
        h.free = free_at(buft, place);
    }
    return by_place;
}

}  // namespace

std::optional<Shortfall> context_shortfall(const std::string & model_path, llama_model_params mp,
                                           const llama_context_params & cp) {
    mp.no_alloc = true;  // metadata and simulated allocations only: no weights read, no KV allocated
    // llama cannot simulate mapped weights (GGML_ASSERT(!ml.no_alloc) on the mmap path); where the weights
    // sit does not change what one context needs
    mp.load_mode = LLAMA_LOAD_MODE_NONE;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (model == nullptr) {
        return std::nullopt;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    std::optional<Shortfall> out;
    if (ctx != nullptr) {
        for (const auto & [place, h] : simulated(ctx)) {
            if (h.free >= 0 && h.kv + h.compute > (uint64_t) h.free) {
                out = Shortfall{place, h.kv + h.compute, h.kv, h.compute, (uint64_t) h.free};
                break;
            }
        }
        llama_free(ctx);
    }
    llama_model_free(model);
    return out;
}

}  // namespace dgr
