// gRPC service dgr.shard.v1.ShardWorker on top of one Stage.
#pragma once

#include "chain.h"
#include "ring.h"
#include "shard.grpc.pb.h"
#include "stage.h"
#include "streams.h"

#include <string>

namespace dgr {

struct BuildIdentity {
    std::string worker_version;
    std::string llama_commit;
    std::string lane;
    std::string model_path;
    std::string identity_json;
    std::string transport;    // the gRPC port's security (options.h, transport_of)
    std::string pass_frames;  // the pass port's frames (options.h, pass_frames_of)
};

class ShardService final : public dgr::shard::v1::ShardWorker::Service {
public:
    ShardService(Stage & stage, BuildIdentity id, ChainPolicy chain = {})
        : stage_(stage), id_(std::move(id)), chain_(std::move(chain)), streams_(chain_, message_limit(stage.info())),
          ring_(chain_) {}

    grpc::Status Info(grpc::ServerContext *, const dgr::shard::v1::InfoRequest *, dgr::shard::v1::InfoReply *) override;
    grpc::Status Forward(grpc::ServerContext *, const dgr::shard::v1::ForwardRequest *,
                         dgr::shard::v1::ForwardReply *) override;
    grpc::Status Reset(grpc::ServerContext *, const dgr::shard::v1::ResetRequest *,
                       dgr::shard::v1::ResetReply *) override;
    grpc::Status Session(grpc::ServerContext *, const dgr::shard::v1::SessionRequest *,
                         dgr::shard::v1::SessionReply *) override;
    grpc::Status Health(grpc::ServerContext *, const dgr::shard::v1::HealthRequest *,
                        dgr::shard::v1::HealthReply *) override;
    grpc::Status Tokenize(grpc::ServerContext *, const dgr::shard::v1::TokenizeRequest *,
                          dgr::shard::v1::TokenizeReply *) override;
    grpc::Status Detokenize(grpc::ServerContext *, const dgr::shard::v1::DetokenizeRequest *,
                            dgr::shard::v1::DetokenizeReply *) override;

    // Take streamed ring passes on ``host``:``port`` (0: any free port); returns the port (Info's pass_port).
    // ``record_dir``: --record-passes (PassStreams::record_to); "": none.
    int listen_passes(const std::string & host, int port, const std::string & record_dir = "");
    // The worker is stopping: close every pass connection now, both ways.
    void stop_streams() { streams_.stop(); }

private:
    // deliver_to set: compute, then hand the boundary to the next stage (or the logits to the sink)
    grpc::Status chained(grpc::ServerContext * ctx, const dgr::shard::v1::ForwardRequest * req, int64_t received_ns);
    // a pass that came on the pass port
    void streamed(dgr::shard::v1::ForwardRequest & req, int64_t received_ns);  // consumes req
    grpc::Status compute(const dgr::shard::v1::ForwardRequest & req, int64_t received_ns, ForwardResult & r,
                         dgr::shard::v1::Hop & hop);
    // the last stage of a ring pass: pick the token, queue its delivery and (unless the ring ends) the next pass
    void ring_on(const dgr::shard::v1::ForwardRequest & req, ForwardResult && r, dgr::shard::v1::Hop && hop);

    Stage & stage_;
    BuildIdentity id_;
    Chain chain_;
    PassStreams streams_;  // after chain_: it asks a stage's Info for its pass port on chain_'s channels
    RingRunner ring_;      // after chain_: it calls through it
};

}  // namespace dgr
