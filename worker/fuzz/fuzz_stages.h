// What every fuzz target does with a request that parsed: read it as the stage takes it and run every
// check a stage runs before it changes anything, against each stage shape a placement has; where a
// shape accepts it, read what the stage's forward would then read (the boundary's bytes, the token
// ids, the positions), so that a check that lets through a request the stage cannot take is an
// out-of-bounds read that AddressSanitizer reports.
#pragma once

#include "shard.pb.h"

namespace dgr::fuzz {

void check_on_every_stage(const dgr::shard::v1::ForwardRequest & req);

}  // namespace dgr::fuzz
