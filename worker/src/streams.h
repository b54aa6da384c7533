// A streamed ring's hops (Ring.stream): one long-lived Passes stream to each neighbour, so a pass
// crossing a seam is one message on an open HTTP/2 stream instead of a whole call (headers, deadline,
// trailers, a server thread hand-off and an ack back through every stage).
//
// One stream per address, not per session: a stage computes one batch at a time (Stage's mutex), so
// a stream per session would add no parallelism, only a lifetime to manage. Passes of one session stay
// in order on it. Writers to one stream take turns (the stage's unary first pass and its stream
// handler can both send downstream). A stream that fails is dropped and the next pass opens a new one.
#pragma once

#include "chain.h"
#include "shard.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace dgr {

class PassStreams {
public:
    explicit PassStreams(Chain & chain) : chain_(chain) {}
    ~PassStreams();

    // Send ``pass`` to the stage at ``address`` on its stream, opening the stream first if needed.
    // Returns the stream's status when the pass could not be handed over (the stream is then dropped).
    ChainResult send(const std::string & address, const dgr::shard::v1::ForwardRequest & pass);

    // Inbound streams, so a stopping worker can end them at once instead of waiting out the call grace.
    void opened(grpc::ServerContext * inbound);
    void closed(grpc::ServerContext * inbound);

    // Cancel every stream, both ways: the worker is stopping (a neighbour's next pass fails and names us).
    void stop();

private:
    struct Stream;

    Chain &                                        chain_;
    std::mutex                                     mu_;
    bool                                           stopping_ = false;
    std::map<std::string, std::shared_ptr<Stream>> out_;
    std::set<grpc::ServerContext *>                in_;
};

}  // namespace dgr
