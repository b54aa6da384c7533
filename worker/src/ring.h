// Ring decode: the last stage of a ring pass picks the greedy token, delivers it with the logits to
// the driver's sink and starts the next pass at stage 0, so no driver call sits between two tokens.
//
// The next pass is an asynchronous call that nobody waits on (the ack of a pass comes back through
// every stage after the next pass has begun; waiting would put n return hops between two tokens), so
// no pass ever runs nested inside the handler of the one before. The handler starts it itself when
// nothing is queued and fewer than kMaxPassesInFlight are outstanding; otherwise the ring's pass
// thread starts it, in order, once there is room. A delivery thread sends deliveries one at a time in
// the order they were queued (the driver reads a stream of tokens), off the critical path: a Deliver
// call each, or a frame on the driver's delivery stream. A pass that fails, or a delivery the sink
// refuses, stops that ring: the first failure reaches the sink as a RING_FAILED delivery naming the stage.
#pragma once

#include "chain.h"
#include "shard.pb.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dgr {

// A computed ring pass as the last stage sees it: what ring_step decides from.
struct RingPass {
    const float * logits = nullptr;                 // [rows, n_vocab], the pass's last ``rows`` rows
    const std::vector<int32_t> * greedy = nullptr;  // or, a token-only ring's, the argmax of each of them
    int64_t rows = 0;
    int32_t n_vocab = 0;
    int32_t first_position = 0, n_positions = 0;
    int32_t drafted = 0;                            // the pass's last tokens that were drafts
    int32_t accepted = 0;                           // of them, the ones that stood (the stage's count)
    const std::vector<int32_t> * drafts = nullptr;  // the nextn block's drafts after the bonus token
    int32_t max_position = 0;                       // the highest position a pass may feed
};

// What the last stage of a ring pass chose and what comes next: one token (Ring.draft 0), or the
// accepted drafts and the bonus token, cut after a stop token or where the budget ends.
struct RingStep {
    std::vector<int32_t> tokens;
    int64_t first_row = 0;  // tokens[j] is the argmax of logits row first_row + j
    dgr::shard::v1::RingEnd end = dgr::shard::v1::RING_CONTINUES;
    int32_t next_position = 0;    // where tokens.back() goes in the next pass
    std::vector<int32_t> drafts;  // fed after it there (trimmed to the budget and context)
};

RingStep ring_step(const dgr::shard::v1::Ring & ring, const RingPass & pass);

// Where a ring's deliveries go: Deliver calls to the driver's sink, or frames to its delivery port
// where the ring names one (Ring.delivery_stream, worker/src/delivery_streams.h).
struct DeliverTo {
    std::string sink;    // the pass's deliver_to: the driver's PipelineSink
    std::string stream;  // Ring.delivery_stream, or empty
};

DeliverTo deliver_to(const dgr::shard::v1::ForwardRequest & pass);

class RingRunner {
public:
    static constexpr int kMaxPassesInFlight = 8;

    explicit RingRunner(Chain & chain);
    ~RingRunner();
    RingRunner(const RingRunner &) = delete;
    RingRunner & operator=(const RingRunner &) = delete;

    // Queue ``delivery`` for ``to`` (sent after every delivery queued before it).
    void deliver(const DeliverTo & to, dgr::shard::v1::Delivery delivery, std::chrono::milliseconds timeout);
    // Queue ``delivery`` and then the ring's next pass for ``address`` (its stage 0), under one lock,
    // so the delivery is ahead of the next pass's own; the pass's failure is delivered to
    // next.deliver_to() as RING_FAILED. The delivery thread is woken after the pass is on its way.
    void deliver_and_start(const DeliverTo & to, dgr::shard::v1::Delivery delivery, const std::string & address,
                           dgr::shard::v1::ForwardRequest next, std::chrono::milliseconds timeout);

    // A streamed ring (Ring.stream): queue ``delivery``, then, when the ring goes on (neither it nor this
    // worker has stopped), run ``send_next`` (the caller's hand-off of the next pass on its stream), and
    // only then wake the delivery thread. Why in that order: waking a sleeping thread costs tens of
    // microseconds on a virtual machine, and the next pass should not wait for it; the delivery is
    // still queued ahead of the next pass's own.
    void deliver_then_go_on(const DeliverTo & to, dgr::shard::v1::Delivery delivery, std::chrono::milliseconds timeout,
                            const std::function<void()> & send_next);
    // A streamed ring's pass failed where nobody waits for its status: stop the ring and tell its sink
    // (RING_FAILED naming ``stage``, detail "WHERE: CODE: message"), once per ring.
    void fail(const DeliverTo & to, const std::string & request_id, uint32_t index, int32_t stage,
              const grpc::Status & status, const std::string & where);

    struct State;

private:
    std::shared_ptr<State> state_;  // shared with the threads and with callbacks of calls in flight
};

}  // namespace dgr
