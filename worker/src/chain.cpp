#include "chain.h"

#include <chrono>

namespace pb = dgr::shard::v1;

namespace dgr {

std::shared_ptr<grpc::Channel> Chain::channel(const std::string & address) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(address);
    if (it != channels_.end()) {
        return it->second;
    }
    grpc::ChannelArguments args;
    // a prefill's boundary or logits exceed the 4 MiB default; a proxy in the environment must
    // never capture a seam
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    auto ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    channels_.emplace(address, ch);
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
        std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace dgr
