#include "ring.h"

#include "affinity.h"
#include "argmax.h"
#include "delivery_streams.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <pthread.h>
#include <thread>
#include <utility>

namespace pb = dgr::shard::v1;

namespace dgr {

RingStep ring_step(const pb::Ring & ring, const RingPass & pass) {
    RingStep step;
    // row j of the verified part chose the token after fed token j; the rows before it judge nothing
    step.first_row = pass.rows - 1 - pass.drafted;
    const uint32_t budget = std::max<uint32_t>(ring.budget(), 1);
    for (int32_t j = 0; j <= pass.accepted; ++j) {
        const int64_t row = step.first_row + j;
        const int32_t token = pass.greedy != nullptr
                                  ? (*pass.greedy)[(size_t) row]
                                  : greedy_token(pass.logits + row * (int64_t) pass.n_vocab, pass.n_vocab);
        step.tokens.push_back(token);
        if (std::find(ring.stop_tokens().begin(), ring.stop_tokens().end(), token) != ring.stop_tokens().end()) {
            step.end = pb::RING_STOP_TOKEN;
            return step;
        }
        if (step.tokens.size() >= budget) {
            step.end = pb::RING_BUDGET;
            return step;
        }
    }
    step.next_position = pass.first_position + (pass.n_positions - pass.drafted) + pass.accepted;
    if (step.next_position > pass.max_position) {
        step.end = pb::RING_CONTEXT_FULL;
        return step;
    }
    if (ring.draft() > 0 && pass.drafts != nullptr) {
        // as the driver's verify loop: no draft past the budget (the pass after can choose one more than
        // it feeds) or past the last position a pass may feed
        const int64_t room = std::min<int64_t>((int64_t) budget - (int64_t) step.tokens.size() - 1,
                                               (int64_t) pass.max_position - step.next_position);
        const int64_t m = std::max<int64_t>(0, std::min<int64_t>((int64_t) pass.drafts->size(), room));
        step.drafts.assign(pass.drafts->begin(), pass.drafts->begin() + m);
    }
    return step;
}

DeliverTo deliver_to(const pb::ForwardRequest & pass) {
    return DeliverTo{pass.deliver_to(), pass.ring().delivery_stream()};
}

namespace {
using ms = std::chrono::milliseconds;

struct DeliveryJob {
    DeliverTo to;
    pb::Delivery delivery;
    ms timeout;
};

struct PassJob {
    std::string address;
    pb::ForwardRequest request;
    ms timeout;
};

// "WHERE: CODE: message", as a chained failure's detail reads.
std::string failure_detail(const std::string & where, const grpc::Status & status) {
    return where + ": " + status_code_name(status.error_code()) + ": " + status.error_message();
}

// Rings told to stop, by request id: true when the sink refused them too (nothing more is sent).
// Entries are made only when a ring fails, so a small bound keeps every ring that can still matter.
constexpr size_t kStoppedKept = 1024;
}  // namespace

struct RingRunner::State {
    explicit State(Chain & c) : chain(c), streams(c.policy().raw_tls.get()) {}

    Chain & chain;
    std::mutex mu;
    std::condition_variable wake_delivery, wake_pass;  // apart: a token wakes only the thread it concerns
    std::deque<DeliveryJob> deliveries;
    std::deque<PassJob> passes;
    int in_flight = 0;
    bool stopping = false;
    std::map<std::string, bool> stopped;
    std::deque<std::string> stopped_order;
    std::thread delivery_thread, pass_thread;
    DeliveryStreams streams;  // the delivery thread's alone

    void stop_ring(const std::string & id, bool sink_gone) {  // mu held
        auto [it, fresh] = stopped.emplace(id, sink_gone);
        it->second = it->second || sink_gone;
        if (fresh) {
            stopped_order.push_back(id);
            if (stopped_order.size() > kStoppedKept) {
                stopped.erase(stopped_order.front());
                stopped_order.pop_front();
            }
        }
    }

    // The first failure of a ring's pass: stop the ring and tell its sink which stage failed.
    void pass_failed(const std::string & address, const std::string & id, const DeliverTo & to, uint32_t index,
                     const ChainResult & r) {
        if (!r.failed_stage.empty()) {  // a hop further on named itself (chain.cpp's trailer)
            failed(id, to, index, std::atoi(r.failed_stage.c_str()), status_code_name(r.status.error_code()),
                   r.status.error_message());
        } else {
            failed(id, to, index, 0, status_code_name(r.status.error_code()),
                   failure_detail("stage 0 at " + address, r.status));
        }
    }

    void failed(const std::string & id, const DeliverTo & to, uint32_t index, int32_t stage, const std::string & code,
                const std::string & detail) {
        pb::Delivery d;
        d.set_request_id(id);
        auto * ring = d.mutable_ring();
        ring->set_token(-1);
        ring->set_index(index);
        ring->set_end(pb::RING_FAILED);
        ring->set_code(code);
        ring->set_failed_stage(stage);
        ring->set_detail(detail);
        std::fprintf(stderr, "dgr-shard-worker: ring %s pass %u failed: %s\n", id.c_str(), index, detail.c_str());
        std::lock_guard<std::mutex> lock(mu);
        if (stopped.count(id)) {
            return;  // only the first failure is news; later ones follow from it
        }
        stop_ring(id, false);
        deliveries.push_back(DeliveryJob{to, std::move(d), ms(30000)});
        wake_delivery.notify_one();
    }

    void deliver_loop() {
        for (;;) {
            DeliveryJob job;
            {
                std::unique_lock<std::mutex> lock(mu);
                wake_delivery.wait(lock, [&] { return stopping || !deliveries.empty(); });
                if (stopping) {
                    return;
                }
                job = std::move(deliveries.front());
                deliveries.pop_front();
                auto it = stopped.find(job.delivery.request_id());
                if (it != stopped.end() && it->second) {
                    continue;  // the sink refused this ring already
                }
            }
            const std::string why = send_delivery(job);
            if (!why.empty()) {
                std::fprintf(stderr, "dgr-shard-worker: ring %s: %s; the ring stops\n",
                             job.delivery.request_id().c_str(), why.c_str());
                std::lock_guard<std::mutex> lock(mu);
                stop_ring(job.delivery.request_id(), true);
            }
        }
    }

    // Hand one delivery to the driver: a Deliver call, or a frame on its delivery stream (whose refusals
    // of earlier deliveries stop those rings). Empty, or why the driver did not take it.
    std::string send_delivery(const DeliveryJob & job) {
        if (job.to.stream.empty()) {
            const ChainResult r = chain.deliver(job.to.sink, job.delivery, job.timeout);
            return r.status.ok() ? ""
                                 : "delivering to the sink at " + job.to.sink + ": " +
                                       status_code_name(r.status.error_code()) + ": " + r.status.error_message();
        }
        std::vector<std::string> refused;
        std::string why;
        const bool sent = streams.send(job.to.stream, job.delivery, job.timeout, refused, why);
        if (!refused.empty()) {
            std::lock_guard<std::mutex> lock(mu);
            for (const std::string & id : refused) {
                stop_ring(id, true);
            }
        }
        return sent ? "" : "delivering to the delivery stream at " + job.to.stream + ": " + why;
    }

    void pass_loop(const std::shared_ptr<State> & self) {
        for (;;) {
            PassJob job;
            {
                std::unique_lock<std::mutex> lock(mu);
                wake_pass.wait(lock, [&] { return stopping || (!passes.empty() && in_flight < kMaxPassesInFlight); });
                if (stopping) {
                    return;
                }
                job = std::move(passes.front());
                passes.pop_front();
                if (stopped.count(job.request.request_id())) {
                    continue;
                }
                ++in_flight;
            }
            send(self, std::move(job));
        }
    }

    // Start one pass (in_flight already counts it) without waiting for its ack.
    static void send(const std::shared_ptr<State> & self, PassJob job) {
        const std::string id = job.request.request_id(), address = job.address;
        const DeliverTo to = deliver_to(job.request);
        const uint32_t index = job.request.ring().index();
        self->chain.forward_async(job.address, std::move(job.request), job.timeout,
                                  [self, id, to, address, index](ChainResult r) {
            {
                std::lock_guard<std::mutex> lock(self->mu);
                --self->in_flight;
                if (!self->passes.empty()) {
                    self->wake_pass.notify_one();
                }
            }
            if (!r.status.ok()) {
                self->pass_failed(address, id, to, index, r);
            }
        });
    }
};

RingRunner::RingRunner(Chain & chain) : state_(std::make_shared<State>(chain)) {
    State * s = state_.get();
    s->delivery_thread = std::thread([s] {
#ifdef __linux__
        pthread_setname_np(pthread_self(), "dgr-deliver");  // as ps, top and /proc name it
#endif
        // deliveries only talk to the driver: with --cpus they run where the worker could before, so
        // a token's gRPC call to the sink does not take turns with the next pass's compute
        unpin_this_thread();
        s->deliver_loop();
    });
    s->pass_thread = std::thread([s, self = state_] { s->pass_loop(self); });
}

RingRunner::~RingRunner() {
    {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->stopping = true;
    }
    state_->wake_delivery.notify_all();
    state_->wake_pass.notify_all();
    state_->delivery_thread.join();
    state_->pass_thread.join();
}

void RingRunner::deliver(const DeliverTo & to, pb::Delivery delivery, ms timeout) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->deliveries.push_back(DeliveryJob{to, std::move(delivery), timeout});
    state_->wake_delivery.notify_one();
}

void RingRunner::deliver_then_go_on(const DeliverTo & to, pb::Delivery delivery, ms timeout,
                                    const std::function<void()> & send_next) {
    bool go_on = false;
    {
        const std::string id = delivery.request_id();
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->deliveries.push_back(DeliveryJob{to, std::move(delivery), timeout});
        go_on = !state_->stopping && !state_->stopped.count(id);
    }
    if (go_on) {
        send_next();
    }
    state_->wake_delivery.notify_one();  // the waiting thread reads the queue under the lock: nothing is missed
}

void RingRunner::fail(const DeliverTo & to, const std::string & request_id, uint32_t index, int32_t stage,
                      const grpc::Status & status, const std::string & where) {
    state_->failed(request_id, to, index, stage, status_code_name(status.error_code()), failure_detail(where, status));
}

void RingRunner::deliver_and_start(const DeliverTo & to, pb::Delivery delivery, const std::string & address,
                                   pb::ForwardRequest next, ms timeout) {
    PassJob job{address, std::move(next), timeout};
    bool now = false;
    {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->deliveries.push_back(DeliveryJob{to, std::move(delivery), timeout});
        // a ring that failed, or whose sink gave up, gets no further pass
        if (!state_->stopped.count(job.request.request_id())) {
            now = state_->passes.empty() && state_->in_flight < kMaxPassesInFlight && !state_->stopping;
            if (now) {
                ++state_->in_flight;
            } else {
                state_->passes.push_back(std::move(job));  // the pass thread keeps the order and the bound
                state_->wake_pass.notify_one();
            }
        }
    }
    // Nothing queued and room in flight: start it here, saving a thread hand-off per token. The call is
    // asynchronous, so the handler still returns at once and no pass waits inside another.
    if (now) {
        State::send(state_, std::move(job));
    }
    state_->wake_delivery.notify_one();  // after the pass, as in deliver_then_go_on
}

}  // namespace dgr
