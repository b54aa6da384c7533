#include "streams.h"

#include <cstdio>
#include <utility>

namespace pb = dgr::shard::v1;

namespace dgr {

struct PassStreams::Stream {
    std::mutex                                          mu;  // one writer at a time
    std::unique_ptr<pb::ShardWorker::Stub>              stub;
    std::unique_ptr<grpc::ClientContext>                ctx;
    pb::PassesClosed                                    closed;
    std::unique_ptr<grpc::ClientWriter<pb::ForwardRequest>> writer;
};

PassStreams::~PassStreams() { stop(); }

ChainResult PassStreams::send(const std::string & address, const pb::ForwardRequest & pass) {
    std::shared_ptr<Stream> s;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) {
            return ChainResult{grpc::Status(grpc::StatusCode::UNAVAILABLE, "this worker is stopping"), ""};
        }
        auto & slot = out_[address];
        if (!slot) {
            slot = std::make_shared<Stream>();
        }
        s = slot;
    }
    std::lock_guard<std::mutex> lock(s->mu);
    if (!s->writer) {
        auto ctx    = std::make_unique<grpc::ClientContext>();
        s->stub     = pb::ShardWorker::NewStub(chain_.channel(address));
        auto writer = s->stub->Passes(ctx.get(), &s->closed);
        std::lock_guard<std::mutex> outer(mu_);  // stop() reads ctx under mu_ alone
        s->ctx    = std::move(ctx);
        s->writer = std::move(writer);
        if (stopping_) {
            s->ctx->TryCancel();
        }
    }
    if (s->writer->Write(pass)) {
        return ChainResult{};
    }
    // the stream is gone (the peer stopped, refused a pass or could not be reached): its status says why
    grpc::Status status = s->writer->Finish();
    if (status.ok()) {
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the stream to " + address + " closed");
    }
    std::unique_ptr<grpc::ClientContext> ctx;  // declared first: destroyed after the writer that uses it
    std::unique_ptr<grpc::ClientWriter<pb::ForwardRequest>> writer;
    {
        std::lock_guard<std::mutex> outer(mu_);
        writer = std::move(s->writer);
        ctx    = std::move(s->ctx);
    }
    return ChainResult{status, ""};
}

void PassStreams::opened(grpc::ServerContext * inbound) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
        inbound->TryCancel();
    }
    in_.insert(inbound);
}

void PassStreams::closed(grpc::ServerContext * inbound) {
    std::lock_guard<std::mutex> lock(mu_);
    in_.erase(inbound);
}

void PassStreams::stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (grpc::ServerContext * inbound : in_) {
        inbound->TryCancel();  // its Read returns false and the handler ends
    }
    for (auto & [address, s] : out_) {
        // not s->mu: a writer may be blocked in Write, and cancelling is what unblocks it (send swaps
        // ctx only under mu_, which we hold)
        if (grpc::ClientContext * ctx = s->ctx.get()) {
            ctx->TryCancel();
        }
    }
}

}  // namespace dgr
