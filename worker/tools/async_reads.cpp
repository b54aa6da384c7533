// dgr-async-reads: do asynchronous reads of several tensors into ordinary host memory, synchronized
// once, each land the bytes of their own tensor? On every backend device this ggml was built with.
// Pure ggml, no model.
//
//   dgr-async-reads
//
// llama_context queues one ggml_backend_tensor_get_async per layer whose input a stage captures, then
// the boundary or the logits, and synchronizes once (llama-context.cpp, extract_layer_inputs). The
// destination is the context's output buffer, which is ordinary host memory where the output device
// offers no pinned host buffer. Two cases, each on a fresh backend:
//   equal: two reads of the same size, one after the other;
//   growing: a small read, then a larger one (the larger needs more staging than the first made).
// Each destination is then compared with its tensor's bytes. A wrong destination is printed with
// whose bytes it holds; under AddressSanitizer a read that uses freed staging memory is reported
// there. Exit 0 when every device got every read right, 1 when one did not, 2 when none ran.
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int64_t SMALL = 1024;       // floats: a 4 KiB read
constexpr int64_t LARGE = 64 * 1024;  // floats: a 256 KiB read, more staging than the small one made

struct Case {
    const char * name;
    std::vector<int64_t> sizes;  // floats of each read, in the order they are queued
};

// The value of element i of tensor t: distinct per tensor, so a wrong destination says whose it holds.
float pattern(size_t t, int64_t i) {
    return (float) (t + 1) * 1000000.0f + (float) i;
}

// Which tensor's bytes ``got`` holds (its index), -1 for none of them.
int whose(const std::vector<float> & got, const std::vector<std::vector<float>> & sources) {
    for (size_t t = 0; t < sources.size(); ++t) {
        const size_t n = std::min(got.size(), sources[t].size());
        if (std::memcmp(got.data(), sources[t].data(), n * sizeof(float)) == 0) {
            return (int) t;
        }
    }
    return -1;
}

// One case on one device: its reads queued, one synchronize; the number of wrong destinations, or -1
// with ``why`` when the device cannot run it.
int run_case(ggml_backend_dev_t dev, const Case & c, std::string & why) {
    const ggml_init_params ip = {ggml_tensor_overhead() * c.sizes.size(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    std::vector<ggml_tensor *> tensors;
    for (int64_t n : c.sizes) {
        tensors.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n));
    }
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    ggml_backend_buffer_t buf = backend ? ggml_backend_alloc_ctx_tensors(ctx, backend) : nullptr;
    int wrong = -1;
    if (backend == nullptr || buf == nullptr) {
        why = backend == nullptr ? "device init failed" : "buffer allocation failed";
    } else {
        std::vector<std::vector<float>> sources(c.sizes.size());
        std::vector<std::vector<float>> dests(c.sizes.size());
        for (size_t t = 0; t < tensors.size(); ++t) {
            sources[t].resize((size_t) c.sizes[t]);
            for (int64_t i = 0; i < c.sizes[t]; ++i) {
                sources[t][(size_t) i] = pattern(t, i);
            }
            ggml_backend_tensor_set(tensors[t], sources[t].data(), 0, ggml_nbytes(tensors[t]));
            dests[t].assign((size_t) c.sizes[t], 0.0f);  // ordinary heap memory, as a host output buffer
        }
        ggml_backend_synchronize(backend);
        for (size_t t = 0; t < tensors.size(); ++t) {
            ggml_backend_tensor_get_async(backend, tensors[t], dests[t].data(), 0, ggml_nbytes(tensors[t]));
        }
        ggml_backend_synchronize(backend);
        wrong = 0;
        for (size_t t = 0; t < tensors.size(); ++t) {
            const int holds = whose(dests[t], sources);
            if (holds != (int) t) {
                ++wrong;
                std::printf("  %s: read %zu (%lld floats) holds %s\n", c.name, t, (long long) c.sizes[t],
                            holds < 0 ? "none of the tensors' bytes"
                                      : ("the bytes of read " + std::to_string(holds)).c_str());
            }
        }
    }
    ggml_backend_buffer_free(buf);
    if (backend) {
        ggml_backend_free(backend);
    }
    ggml_free(ctx);
    return wrong;
}

}  // namespace

int main() {
    const Case cases[] = {{"equal", {SMALL, SMALL}}, {"growing", {SMALL, LARGE}}};
    int devices = 0, failed = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        std::printf("%s (%s):\n", ggml_backend_dev_name(dev), ggml_backend_dev_description(dev));
        for (const Case & c : cases) {
            std::string why;
            const int wrong = run_case(dev, c, why);
            if (wrong < 0) {
                std::printf("  %s: skipped: %s\n", c.name, why.c_str());
                continue;
            }
            ++devices;
            failed += wrong > 0;
            std::printf("  %s: %s\n", c.name, wrong == 0 ? "every read holds its own tensor's bytes" : "WRONG");
        }
    }
    return devices == 0 ? 2 : failed > 0 ? 1 : 0;
}
