// The client side of chained forwarding: a stage hands its boundary straight to the next stage's
// Forward, and the last stage hands its logits to the driver's PipelineSink.
//
// One channel per address, created on first use and kept for the life of the process (a decode
// loop calls the same neighbour once per token). Calls take their deadline and cancellation from
// the incoming call, so a driver giving up (or a worker shutting down) ends the whole chain.
#pragma once

#include "shard.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace dgr {

// Trailer naming the stage a chained failure belongs to; a stage passes such a failure on unchanged.
inline constexpr const char * kFailedStageKey = "dgr-failed-stage";

struct ChainResult {
    grpc::Status status;
    std::string  failed_stage;  // the kFailedStageKey trailer of a failed reply; empty when absent
};

class Chain {
public:
    ChainResult forward(const grpc::ServerContext & parent, const std::string & address,
                        const dgr::shard::v1::ForwardRequest & request);
    ChainResult deliver(const grpc::ServerContext & parent, const std::string & address,
                        const dgr::shard::v1::Delivery & delivery);

private:
    std::shared_ptr<grpc::Channel> channel(const std::string & address);

    std::mutex mu_;
    std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

// "UNAVAILABLE", "INVALID_ARGUMENT", ... as the Python client names status codes.
const char * status_code_name(grpc::StatusCode code);

// CLOCK_MONOTONIC nanoseconds (steady_clock on Linux), the clock of Hop.received_ns / sent_ns.
int64_t monotonic_ns();

}  // namespace dgr
