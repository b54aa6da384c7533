#include "chain.h"

#include <algorithm>
#include <chrono>
#include <climits>

namespace pb = dgr::shard::v1;

namespace dgr {

int message_limit(const StageInfo & in) {
    const int64_t rows = std::max<int64_t>(1, in.n_batch);
    const int64_t width = std::max<int64_t>(in.boundary_width, in.n_embd);
    const int64_t row_bytes = 4 * ((int64_t) in.n_vocab + ((int64_t) in.n_layer + 1) * width) + 16;
    const int64_t bytes = rows * row_bytes + ((int64_t) in.n_layer + 1) * 1024 + (1 << 20);
    return (int) std::min<int64_t>(bytes, INT_MAX);
}

std::string Chain::refusal(const std::string & address) const {
    if (policy_.peers.empty()) {
        return "";
    }
    std::string host, port;
    if (split_host_port(address, host, port, false) && (peers_.count(address) || peers_.count(host + ":*"))) {
        return "";
    }
    std::string listed;
    for (const std::string & peer : policy_.peers) {
        listed += (listed.empty() ? "" : ",") + peer;
    }
    return "address '" + address + "' is not in this worker's --peers (" + listed +
           "); start every worker with the placement's addresses and the driver's host";
}

std::shared_ptr<grpc::Channel> Chain::channel(const std::string & address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(address);
    if (it != channels_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);  // most recently used to the front
        return it->second->second;
    }
    grpc::ChannelArguments args;
    // a prefill's boundary or logits exceed the 4 MiB default (the model's own bound instead); a
    // proxy in the environment must never capture a seam
    args.SetMaxReceiveMessageSize(policy_.max_message_bytes);
    args.SetMaxSendMessageSize(policy_.max_message_bytes);
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    auto ch = grpc::CreateCustomChannel(
        address, policy_.credentials ? policy_.credentials : grpc::InsecureChannelCredentials(), args);
    lru_.emplace_front(address, ch);
    channels_[address] = lru_.begin();
    if (lru_.size() > kMaxChannels) {  // a call still using the dropped channel keeps its own reference
        channels_.erase(lru_.back().first);
        lru_.pop_back();
    }
    return ch;
}

static std::string trailer(const grpc::ClientContext & ctx, const char * key) {
    const auto & md = ctx.GetServerTrailingMetadata();
    auto it = md.find(key);
    return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

ChainResult Chain::forward(const grpc::ServerContext & parent, const std::string & address,
                           const pb::ForwardRequest & request) {
    auto stub = pb::ShardWorker::NewStub(channel(address));
    std::unique_ptr<grpc::ClientContext> ctx = grpc::ClientContext::FromServerContext(parent);
    pb::ForwardReply ack;
    ChainResult r;
    r.status = stub->Forward(ctx.get(), request, &ack);
    if (!r.status.ok()) {
        r.failed_stage = trailer(*ctx, kFailedStageKey);
    }
    return r;
}

ChainResult Chain::deliver(const grpc::ServerContext & parent, const std::string & address,
                           const pb::Delivery & delivery) {
    auto stub = pb::PipelineSink::NewStub(channel(address));
    std::unique_ptr<grpc::ClientContext> ctx = grpc::ClientContext::FromServerContext(parent);
    pb::DeliveryAck ack;
    ChainResult r;
    r.status = stub->Deliver(ctx.get(), delivery, &ack);
    return r;
}

namespace {
// One call in flight: gRPC needs the context, request and reply alive until the callback has run.
struct AsyncForward {
    std::unique_ptr<pb::ShardWorker::Stub> stub;
    grpc::ClientContext ctx;
    pb::ForwardRequest request;
    pb::ForwardReply ack;
};
}  // namespace

void Chain::forward_async(const std::string & address, pb::ForwardRequest request, std::chrono::milliseconds timeout,
                          std::function<void(ChainResult)> done) {
    auto call = std::make_shared<AsyncForward>();
    call->stub = pb::ShardWorker::NewStub(channel(address));
    call->ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    call->request = std::move(request);
    AsyncForward * raw = call.get();
    raw->stub->async()->Forward(&raw->ctx, &raw->request, &raw->ack,
                                [call = std::move(call), done = std::move(done)](grpc::Status status) {
        ChainResult r;
        r.status = std::move(status);
        if (!r.status.ok()) {
            r.failed_stage = trailer(call->ctx, kFailedStageKey);
        }
        done(r);
    });
}

ChainResult Chain::deliver(const std::string & address, const pb::Delivery & delivery,
                           std::chrono::milliseconds timeout) {
    auto stub = pb::PipelineSink::NewStub(channel(address));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    pb::DeliveryAck ack;
    ChainResult r;
    r.status = stub->Deliver(&ctx, delivery, &ack);
    return r;
}

const char * status_code_name(grpc::StatusCode code) {
    switch (code) {
        case grpc::StatusCode::OK:                  return "OK";
        case grpc::StatusCode::CANCELLED:           return "CANCELLED";
        case grpc::StatusCode::UNKNOWN:             return "UNKNOWN";
        case grpc::StatusCode::INVALID_ARGUMENT:    return "INVALID_ARGUMENT";
        case grpc::StatusCode::DEADLINE_EXCEEDED:   return "DEADLINE_EXCEEDED";
        case grpc::StatusCode::NOT_FOUND:           return "NOT_FOUND";
        case grpc::StatusCode::ALREADY_EXISTS:      return "ALREADY_EXISTS";
        case grpc::StatusCode::PERMISSION_DENIED:   return "PERMISSION_DENIED";
        case grpc::StatusCode::RESOURCE_EXHAUSTED:  return "RESOURCE_EXHAUSTED";
        case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
        case grpc::StatusCode::ABORTED:             return "ABORTED";
        case grpc::StatusCode::OUT_OF_RANGE:        return "OUT_OF_RANGE";
        case grpc::StatusCode::UNIMPLEMENTED:       return "UNIMPLEMENTED";
        case grpc::StatusCode::INTERNAL:            return "INTERNAL";
        case grpc::StatusCode::UNAVAILABLE:         return "UNAVAILABLE";
        case grpc::StatusCode::DATA_LOSS:           return "DATA_LOSS";
        case grpc::StatusCode::UNAUTHENTICATED:     return "UNAUTHENTICATED";
        default:                                    return "UNKNOWN";
    }
}

int64_t monotonic_ns() {
    return (int64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace dgr
