// A ForwardRequest off the wire, read into the arguments a stage takes (request_args.h).
#include "request_args.h"

#include <algorithm>

namespace dgr {

namespace pb = dgr::shard::v1;

static bool read_dtype(pb::DType d, DType & out) {
    switch (d) {
        case pb::DTYPE_UNSPECIFIED:
        case pb::F32:               out = DType::F32; return true;
        case pb::F16:               out = DType::F16; return true;
        default:                    return false;
    }
}

ForwardArgs read_args(const pb::ForwardRequest & req) {
    ForwardArgs a;
    a.session_id = req.session_id();
    a.epoch = req.epoch();
    a.positions.assign(req.positions().begin(), req.positions().end());
    a.tokens.assign(req.tokens().begin(), req.tokens().end());
    a.all_logits = req.all_logits();
    a.rewind = req.rewind();
    a.draft = (int32_t) std::min<uint32_t>(req.draft(), 1u << 20);
    a.drafted = (int32_t) std::min<uint32_t>(req.drafted(), 1u << 20);
    a.capture_layers.assign(req.capture_layers().begin(), req.capture_layers().end());
    a.greedy_only = req.has_ring() && req.ring().tokens_only();
    if (req.has_ring() && req.ring().draft() > 0) {
        // a drafting ring's last stage drafts the ring's count and delivers the row every chosen token
        // came from: each row of such a pass (the last chosen token, then drafts) chooses one
        a.draft = (int32_t) std::min<uint32_t>(req.ring().draft(), 1u << 20);
        a.all_logits = true;
    }
    if (!read_dtype(req.boundary_dtype(), a.boundary_dtype)) {
        throw StageError(StageError::Kind::InvalidArgument, "boundary_dtype " +
                                                                std::to_string((int) req.boundary_dtype()) +
                                                                " is not supported (F32 or F16)");
    }
    if (req.has_boundary()) {
        const auto & b = req.boundary();
        a.has_boundary = true;
        if (b.dtype() == pb::DTYPE_UNSPECIFIED || !read_dtype(b.dtype(), a.boundary.dtype)) {
            throw StageError(StageError::Kind::InvalidArgument, "boundary dtype must be F32 or F16");
        }
        a.boundary.shape.assign(b.shape().begin(), b.shape().end());
        a.boundary.data = &b.data();
    }
    return a;
}

bool is_streamed_pass(const pb::ForwardRequest & pass) {
    return pass.has_ring() && pass.ring().stream() && !pass.deliver_to().empty();
}

}  // namespace dgr
