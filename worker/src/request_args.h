// A ForwardRequest as the stage takes it: one reader for the gRPC Forward, a chained hop and a pass on
// the pass port, so that every way a pass arrives is checked the same (and fuzzed once, worker/fuzz).
#pragma once

#include "shard.pb.h"
#include "stage_types.h"

namespace dgr {

// The request's fields as the stage takes them; throws StageError on what the wire cannot carry (an
// unknown dtype). Counts the wire holds as 32-bit unsigned (draft, drafted) are bounded at 2^20. The
// arguments point into ``req`` (the boundary's bytes): it must outlive them.
ForwardArgs read_args(const dgr::shard::v1::ForwardRequest & req);

// What the pass port takes: a streamed ring's pass (Ring.stream set) with the driver's sink to deliver
// to. Only our own stages dial the port, and a pass without a sink has nobody to fail to.
bool is_streamed_pass(const dgr::shard::v1::ForwardRequest & pass);

}  // namespace dgr
