// How the stage's weights sit in memory: llama's load mode, and what the kernel made of it.
//
// Where the weights stay in host memory (the CPU lane, or --n-gpu-layers 0) the worker reads them into
// its own memory (llama's load mode "none") instead of mapping the file: ggml then allocates them with
// ggml_aligned_malloc, which advises large buffers for transparent huge pages (patch 0005), and a
// decode pass streams them with far fewer TLB misses (figures: worker/README.md, "Weights in memory").
// Mapped weights stay in the page cache on 4 KiB pages. Where the weights go to a device, llama's own
// choice ("auto": mmap where every device supports it) is kept.
#pragma once

#include "llama.h"

#include <cstdint>
#include <string>

namespace dgr {

// llama's load mode of that name (none, mmap, mlock, mmap+mlock, dio, auto); throws
// std::invalid_argument naming the accepted values for any other name.
llama_load_mode parse_load_mode(const std::string & name);

// The load mode a stage uses: ``name`` (--load) when given, else the default above.
llama_load_mode choose_load_mode(const std::string & name, int32_t n_gpu_layers);

// Anonymous memory of this process on huge pages (/proc/self/smaps_rollup AnonHugePages), in bytes;
// -1 where the kernel does not say.
int64_t anon_huge_page_bytes();

}  // namespace dgr
