// libFuzzer target: a ForwardRequest's bytes as a gRPC Forward or a chained hop hands them to a stage
// (worker/fuzz/CMakeLists.txt).
#include "fuzz_stages.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    dgr::shard::v1::ForwardRequest req;
    if (req.ParseFromArray(data, (int) size)) {
        dgr::fuzz::check_on_every_stage(req);
    }
    return 0;
}
