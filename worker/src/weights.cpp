#include "weights.h"

#include "ggml-backend.h"

#include <fstream>
#include <stdexcept>

namespace dgr {

namespace {
// Whether any weight can leave host memory: a GPU device is registered and layers may go to it.
bool weights_may_leave_host(int32_t n_gpu_layers) {
    if (n_gpu_layers == 0) {
        return false;
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        const enum ggml_backend_dev_type type = ggml_backend_dev_type(ggml_backend_dev_get(i));
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            return true;
        }
    }
    return false;
}
}  // namespace

llama_load_mode parse_load_mode(const std::string & name) {
    try {
        return llama_load_mode_from_str(name.c_str());
    } catch (const std::invalid_argument &) {
        throw std::invalid_argument("unknown load mode '" + name +
                                    "' (one of none, mmap, mlock, mmap+mlock, dio, auto)");
    }
}

llama_load_mode choose_load_mode(const std::string & name, int32_t n_gpu_layers) {
    if (name.empty()) {
        return weights_may_leave_host(n_gpu_layers) ? LLAMA_LOAD_MODE_AUTO : LLAMA_LOAD_MODE_NONE;
    }
    return parse_load_mode(name);
}

int64_t anon_huge_page_bytes() {
    std::ifstream rollup("/proc/self/smaps_rollup");
    std::string key;
    int64_t kib = 0;
    while (rollup >> key) {
        if (key == "AnonHugePages:" && rollup >> kib) {
            return kib * 1024;
        }
    }
    return -1;
}

}  // namespace dgr
