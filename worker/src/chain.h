// The client side of chained forwarding: a stage hands its boundary straight to the next stage's
// Forward, and the last stage hands its logits to the driver's PipelineSink.
//
// What a worker dials is bounded: with --peers only the listed addresses (HOST:PORT, or HOST:* for
// any port of a host: the driver's sink), every address of a chained request checked before the stage
// computes; without it any address, but at most kMaxChannels channels are kept (least recently used
// first out; a decode loop calls the same neighbour once per token). Messages are capped at a size
// derived from the model (message_limit). Calls take their deadline and cancellation from the
// incoming call, so a driver giving up (or a worker shutting down) ends the whole chain.
#pragma once

#include "secure_link.h"

#include "shard.grpc.pb.h"
#include "stage.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dgr {

// Trailer naming the stage a chained failure belongs to; a stage passes such a failure on unchanged.
inline constexpr const char * kFailedStageKey = "dgr-failed-stage";

struct ChainResult {
    grpc::Status status;
    std::string failed_stage;  // the kFailedStageKey trailer of a failed reply; empty when absent
};

// The largest message a stage of this model sends or takes, in bytes: n_batch rows of logits plus a
// boundary (or residual) row per layer and one more (all_logits replies, captures, chained traces that
// keep every hop's boundary), with room for ids, positions and hop records; clamped to gRPC's int.
int message_limit(const StageInfo & in);

// Whom a worker may dial for chained forwarding.
struct ChainPolicy {
    std::vector<std::string> peers;  // --peers entries (HOST:PORT or HOST:*); empty: any address
    int max_message_bytes = -1;      // -1: gRPC's unlimited
    // mutual TLS towards the next stages and the driver's sink (--tls); null: plaintext
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    // the same identity over the raw TCP connections: pass ports, the driver's delivery port; null: plain
    std::shared_ptr<const TlsContexts> raw_tls;
    int max_pass_connections = 16;  // --max-pass-connections: accepted at once on the pass port
};

class Chain {
public:
    static constexpr size_t kMaxChannels = 16;

    const ChainPolicy & policy() const { return policy_; }

    explicit Chain(ChainPolicy policy = {})
        : policy_(std::move(policy)), peers_(policy_.peers.begin(), policy_.peers.end()) {}

    // Why this worker will not dial ``address`` ("" when it will).
    std::string refusal(const std::string & address) const;

    ChainResult forward(const grpc::ServerContext & parent, const std::string & address,
                        const dgr::shard::v1::ForwardRequest & request);
    ChainResult deliver(const grpc::ServerContext & parent, const std::string & address,
                        const dgr::shard::v1::Delivery & delivery);

    // Calls with no incoming call to take a deadline from (a ring's next pass and its deliveries):
    // ``timeout`` from now. forward_async returns at once; ``done`` runs on a gRPC thread with the ack.
    void forward_async(const std::string & address, dgr::shard::v1::ForwardRequest request,
                       std::chrono::milliseconds timeout, std::function<void(ChainResult)> done);
    ChainResult deliver(const std::string & address, const dgr::shard::v1::Delivery & delivery,
                        std::chrono::milliseconds timeout);

    // The channel to ``address`` (kept, least recently used first out); streams.cpp asks a stage's Info
    // for its pass port on it.
    std::shared_ptr<grpc::Channel> channel(const std::string & address);

private:
    ChainPolicy policy_;
    // the --peers entries as a set: a ring pass checks every address of its route, each pass
    std::set<std::string> peers_;
    std::mutex mu_;
    std::list<std::pair<std::string, std::shared_ptr<grpc::Channel>>> lru_;  // most recently used first
    std::map<std::string, decltype(lru_)::iterator> channels_;
};

// "UNAVAILABLE", "INVALID_ARGUMENT", ... as the Python client names status codes.
const char * status_code_name(grpc::StatusCode code);

// CLOCK_MONOTONIC nanoseconds (steady_clock on Linux), the clock of Hop.received_ns / sent_ns.
int64_t monotonic_ns();

}  // namespace dgr
