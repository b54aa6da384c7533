// Whether one session's context fits before the stage allocates it (issue 41: "a stage that cannot
// allocate the scenario's context refuses at start with one line naming the stage, the bytes it needs
// and the bytes it has").
//
// Why not just allocate and see: on Linux a large host allocation usually succeeds (the kernel
// overcommits) and the worker is killed later, mid-certification, when the KV cache is first written.
// So the stage first simulates the context on a metadata-only load of its own layer range (llama's
// no_alloc model parameter, the same path llama's own fitting uses), sums the KV and compute bytes each
// device would hold, and compares them with what that device has free: the host's MemAvailable for host
// buffers (ggml's CPU device reports its total as free), the device's own free memory for the others.
#pragma once

#include "llama.h"

#include <cstdint>
#include <optional>
#include <string>

namespace dgr {

struct Shortfall {
    std::string device;  // "host memory" or the ggml device's name
    uint64_t need = 0;   // KV + compute bytes one session context puts there
    uint64_t kv = 0;
    uint64_t compute = 0;
    uint64_t have = 0;  // free there now
};

// The first device that cannot hold one session context of ``cp`` for the layer range of ``mp``, or
// nullopt when every device can (or when the simulation itself fails: the real allocation then decides).
std::optional<Shortfall> context_shortfall(const std::string & model_path, llama_model_params mp,
                                           const llama_context_params & cp);

// /proc/meminfo's MemAvailable in bytes; -1 where the kernel does not say.
int64_t host_available_bytes();

}  // namespace dgr
