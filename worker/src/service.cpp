#include "service.h"

#include "options.h"
#include "request_args.h"
#include "weights.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace pb = dgr::shard::v1;

namespace dgr {

static grpc::Status to_status(const StageError & e) {
    using K = StageError::Kind;
    grpc::StatusCode code = grpc::StatusCode::INTERNAL;
    switch (e.kind) {
        case K::InvalidArgument:    code = grpc::StatusCode::INVALID_ARGUMENT; break;
        case K::FailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
        case K::NotFound:           code = grpc::StatusCode::NOT_FOUND; break;
        case K::ResourceExhausted:  code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
        case K::PermissionDenied:   code = grpc::StatusCode::PERMISSION_DENIED; break;
        case K::Internal:           code = grpc::StatusCode::INTERNAL; break;
    }
    return grpc::Status(code, e.what());
}

// Runs fn and turns every failure into a gRPC status naming it; nothing escapes into the gRPC threads.
template <typename Fn>
static grpc::Status guarded(const char * rpc, Fn && fn) {
    try {
        fn();
        return grpc::Status::OK;
    } catch (const StageError & e) {
        std::fprintf(stderr, "dgr-shard-worker: %s: %s\n", rpc, e.what());
        return to_status(e);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "dgr-shard-worker: %s failed: %s\n", rpc, e.what());
        return grpc::Status(grpc::StatusCode::INTERNAL, std::string(rpc) + " failed: " + e.what());
    }
}

static void put_layer_state(const LayerState & s, pb::LayerState * out) {
    out->set_layer(s.layer);
    out->set_kind(s.kind);
    out->set_entries_held(s.entries_held);
    out->set_rows(s.rows);
    out->set_candidates_max(s.candidates_max);
    out->set_selected_at_max(s.selected_at_max);
    out->set_excluding_rows(s.excluding_rows);
    out->set_window_max(s.window_max);
    out->set_raw_cells(s.raw_cells);
}

// Moves the bytes into the message: a result is sent once, so its buffer need not be copied.
static void put_tensor(TensorOut && t, pb::Tensor * out) {
    out->set_dtype(t.dtype == DType::F16 ? pb::F16 : pb::F32);
    for (int64_t d : t.shape) {
        out->add_shape(d);
    }
    out->set_data(std::move(t.data));
}

grpc::Status ShardService::Info(grpc::ServerContext *, const pb::InfoRequest *, pb::InfoReply * reply) {
    return guarded("Info", [&] {
        const StageInfo & in = stage_.info();
        reply->set_worker_version(id_.worker_version);
        reply->set_llama_commit(id_.llama_commit);
        reply->set_lane(id_.lane);
        reply->set_backend_devices(in.backend_devices);
        reply->set_model_path(id_.model_path);
        reply->set_architecture(in.architecture);
        reply->set_n_layer(in.n_layer);
        reply->set_layer_begin(in.layer_begin);
        reply->set_layer_end(in.layer_end);
        reply->set_first_stage(in.first_stage);
        reply->set_last_stage(in.last_stage);
        reply->set_n_embd(in.n_embd);
        reply->set_boundary_width(in.boundary_width);
        reply->set_needs_token_sideband(in.needs_token_sideband);
        reply->set_n_vocab(in.n_vocab);
        reply->set_n_ctx(in.n_ctx);
        reply->set_n_threads(in.n_threads);
        reply->set_n_batch(in.n_batch);
        reply->set_max_rewind(in.max_rewind);
        reply->set_mtp(in.mtp);
        reply->set_pass_port(streams_.port());
        reply->set_cpus(in.cpus);
        reply->set_transport(id_.transport);
        reply->set_pass_frames(id_.pass_frames);
        auto * m = reply->mutable_memory();
        m->set_weight_bytes(in.memory.weight_bytes);
        m->set_kv_bytes(in.memory.kv_bytes);
        m->set_compute_bytes(in.memory.compute_bytes);
        m->set_load_mode(in.memory.load_mode);
        for (const auto & [layer, bytes] : in.memory.kv_bytes_by_layer) {
            auto * l = m->add_kv_layers();
            l->set_layer(layer);
            l->set_bytes(bytes);
        }
        m->set_kv_unread_bytes(in.memory.kv_unread_bytes);
        m->set_huge_page_bytes(anon_huge_page_bytes());  // live: khugepaged may add pages later
        m->set_has_token_embedding(in.first_stage);  // llama loads the embedding with layer 0, the head with the last
        m->set_has_output_head(in.last_stage);
        reply->set_identity_json(id_.identity_json);
        for (const LayerState & s : stage_.census()) {
            put_layer_state(s, reply->add_census());
        }
    });
}

grpc::Status ShardService::Forward(grpc::ServerContext * ctx, const pb::ForwardRequest * req,
                                   pb::ForwardReply * reply) {
    const int64_t received_ns = monotonic_ns();
    if (!req->deliver_to().empty()) {
        return chained(ctx, req, received_ns);
    }
    return guarded("Forward", [&] {
        if (req->downstream_size() > 0) {
            throw StageError(StageError::Kind::InvalidArgument, "downstream addresses without deliver_to: a chained "
                                                                "call needs the driver's sink address");
        }
        if (req->has_ring()) {
            throw StageError(StageError::Kind::InvalidArgument, "ring without deliver_to: a ring's tokens go to "
                                                                "the driver's sink");
        }
        ForwardResult r = stage_.forward(read_args(*req));
        if (r.has_boundary) {
            put_tensor(std::move(r.boundary), reply->mutable_boundary());
        }
        if (r.has_logits) {
            put_tensor(std::move(r.logits), reply->mutable_logits());
        }
        for (auto & [layer, t] : r.captures) {
            auto * c = reply->add_captures();
            c->set_layer(layer);
            put_tensor(std::move(t), c->mutable_residual());
        }
        reply->set_compute_seconds(r.compute_seconds);
        reply->set_kv_used(r.kv_used);
        reply->mutable_draft()->Add(r.draft.begin(), r.draft.end());
        reply->set_accepted(r.accepted);
    });
}

// A chained failure further down: pass on one that already names its stage (the trailer), else name
// the hop we called. The status code is kept, so the driver sees what the failing stage said.
static grpc::Status hop_failure(grpc::ServerContext * ctx, const ChainResult & r, int32_t stage,
                                const std::string & what) {
    if (!r.failed_stage.empty()) {
        ctx->AddTrailingMetadata(kFailedStageKey, r.failed_stage);
        return r.status;
    }
    const std::string msg = what + ": " + status_code_name(r.status.error_code()) + ": " + r.status.error_message();
    std::fprintf(stderr, "dgr-shard-worker: chained Forward: %s\n", msg.c_str());
    ctx->AddTrailingMetadata(kFailedStageKey, std::to_string(stage));
    return grpc::Status(r.status.error_code(), msg);
}

// What a ring pass must carry; only the last stage can check the route's length against its index.
static void check_ring(const pb::ForwardRequest & req, int32_t index, const StageInfo & in) {
    const pb::Ring & ring = req.ring();
    auto bad = [](const std::string & why) {
        throw StageError(StageError::Kind::InvalidArgument, "ring Forward: " + why);
    };
    if (ring.budget() < 1) {
        bad("budget 0: a ring pass chooses one token");
    }
    if (req.positions().empty()) {
        bad("no positions");
    }
    if (in.last_stage && ring.stages_size() != index + 1) {
        bad("this is stage " + std::to_string(index) + ", the last, but the ring names " +
            std::to_string(ring.stages_size()) + " stage address(es)");
    }
    if (ring.draft() == 0 && req.drafted() > 0) {
        bad("drafted tokens in a ring without draft: only a drafting ring verifies drafts");
    }
    std::string host, port;
    if (!ring.delivery_stream().empty() && !split_host_port(ring.delivery_stream(), host, port, false)) {
        bad("delivery_stream '" + ring.delivery_stream() + "' is not HOST:PORT");
    }
    if (ring.draft() == 0) {
        return;
    }
    // a drafting ring refuses at its first pass what would fail it later (a rewind, the first draft)
    auto unable = [&](const std::string & why) {
        throw StageError(StageError::Kind::FailedPrecondition,
                         "ring Forward with draft " + std::to_string(ring.draft()) + ": " + why);
    };
    if ((int32_t) ring.draft() > in.max_rewind) {
        unable("a pass can reject every draft, and this stage takes back at most " + std::to_string(in.max_rewind) +
               " position(s) (start every stage with --max-rewind " + std::to_string(ring.draft()) + ")");
    }
    if (in.last_stage && !in.mtp) {
        unable("the last stage drafts with the nextn block, and this one was started without --mtp");
    }
}

// A chained or ring pass's own part: every check of the route, then this stage's layers; ``hop`` is
// this stage's trace entry. A failure is this stage's own (the caller names it).
grpc::Status ShardService::compute(const pb::ForwardRequest & req, int64_t received_ns, ForwardResult & r,
                                   pb::Hop & hop) {
    const int32_t index = req.trace_size();
    const StageInfo & in = stage_.info();
    const std::string range = std::to_string(in.layer_begin) + ":" + std::to_string(in.layer_end);
    grpc::Status own = guarded("Forward", [&] {
        if (!req.capture_layers().empty()) {
            throw StageError(StageError::Kind::InvalidArgument, "capture_layers is not supported on a chained call "
                                                                "(deliver_to set); capture on a relayed call");
        }
        if (in.last_stage && req.downstream_size() > 0) {
            throw StageError(StageError::Kind::InvalidArgument, "chained Forward: this is the last stage (layers " +
                                                                    range + " of " + std::to_string(in.n_layer) +
                                                                    ") but " + std::to_string(req.downstream_size()) +
                                                                    " downstream address(es) were given");
        }
        if (!in.last_stage && req.downstream_size() == 0) {
            throw StageError(StageError::Kind::InvalidArgument,
                             "chained Forward: this stage (layers " + range + " of " + std::to_string(in.n_layer) +
                                 ") is not the last but no downstream address was given");
        }
        // every address of the chain, not only the one this stage dials: a refused chain changes no stage
        for (const std::string & address : req.downstream()) {
            const std::string why = chain_.refusal(address);
            if (!why.empty()) {
                throw StageError(StageError::Kind::PermissionDenied, "chained Forward: downstream " + why);
            }
        }
        if (const std::string why = chain_.refusal(req.deliver_to()); !why.empty()) {
            throw StageError(StageError::Kind::PermissionDenied, "chained Forward: deliver_to " + why);
        }
        if (req.has_ring()) {
            check_ring(req, index, in);
            for (const std::string & address : req.ring().stages()) {
                const std::string why = chain_.refusal(address);
                if (!why.empty()) {
                    throw StageError(StageError::Kind::PermissionDenied, "ring Forward: stage " + why);
                }
            }
            if (!req.ring().delivery_stream().empty()) {
                if (const std::string why = chain_.refusal(req.ring().delivery_stream()); !why.empty()) {
                    throw StageError(StageError::Kind::PermissionDenied, "ring Forward: delivery_stream " + why);
                }
            }
        }
        r = stage_.forward(read_args(req));
    });
    hop.set_stage(index);
    hop.set_layer_begin(in.layer_begin);
    hop.set_layer_end(in.layer_end);
    hop.set_compute_seconds(r.compute_seconds);
    hop.set_received_ns(received_ns);
    return own;
}

// Turn the pass this (non-last) stage received into the one it hands the next, in place: its boundary
// instead of the one it read, the route shortened by one and its own hop appended to the trace (sent_ns
// set last, just before sending). Every other field travels as it came. In place, because a ring pass
// carries every stage's address and the hops so far: copying them per stage cost a 12-stage ring
// more than the loopback write (worker/README.md, "Ring decode").
static void hand_on(pb::ForwardRequest & pass, ForwardResult && r, pb::Hop && hop) {
    pass.mutable_boundary()->Clear();  // put_tensor fills a fresh Tensor
    put_tensor(std::move(r.boundary), pass.mutable_boundary());
    pass.mutable_downstream()->erase(pass.mutable_downstream()->begin());
    hop.set_boundary_bytes(pass.boundary().data().size());
    if (pass.keep_boundaries()) {
        *hop.mutable_boundary() = pass.boundary();
    }
    pb::Hop * mine = pass.add_trace();
    *mine = std::move(hop);
    mine->set_sent_ns(monotonic_ns());
}

grpc::Status ShardService::chained(grpc::ServerContext * ctx, const pb::ForwardRequest * req, int64_t received_ns) {
    const int32_t index = req->trace_size();
    ForwardResult r;
    pb::Hop hop;
    if (grpc::Status own = compute(*req, received_ns, r, hop); !own.ok()) {
        return own;  // the caller names us: it knows our address
    }
    if (!stage_.info().last_stage) {
        const std::string & address = req->downstream(0);  // *req stays as it came: next is a copy
        pb::ForwardRequest next = *req;
        hand_on(next, std::move(r), std::move(hop));
        // a streamed ring's first pass: stage 0 hands it on over its pass connection and acks at once
        const ChainResult res =
            req->ring().stream() ? streams_.send(address, next) : chain_.forward(*ctx, address, next);
        if (!res.status.ok()) {
            return hop_failure(ctx, res, index + 1, "stage " + std::to_string(index + 1) + " at " + address);
        }
        return grpc::Status::OK;
    }

    if (req->has_ring()) {
        ring_on(*req, std::move(r), std::move(hop));
        return grpc::Status::OK;  // the ack: the delivery and the next pass go from the ring's own threads
    }

    pb::Delivery d;
    d.set_request_id(req->request_id());
    put_tensor(std::move(r.logits), d.mutable_reply()->mutable_logits());
    d.mutable_reply()->set_compute_seconds(r.compute_seconds);
    d.mutable_reply()->set_kv_used(r.kv_used);
    d.mutable_reply()->mutable_draft()->Add(r.draft.begin(), r.draft.end());
    d.mutable_reply()->set_accepted(r.accepted);
    d.mutable_trace()->CopyFrom(req->trace());
    pb::Hop * mine = d.add_trace();
    *mine = std::move(hop);
    mine->set_sent_ns(monotonic_ns());
    const ChainResult res = chain_.deliver(*ctx, req->deliver_to(), d);
    if (!res.status.ok()) {
        // the sink is the driver's: name the last stage (which could not deliver) and the sink's address
        return hop_failure(ctx, ChainResult{res.status, ""}, index, "delivering to the sink at " + req->deliver_to());
    }
    return grpc::Status::OK;
}

int ShardService::listen_passes(const std::string & host, int port, const std::string & record_dir) {
    streams_.record_to(record_dir);
    return streams_.listen(host, port, [this](pb::ForwardRequest & pass, int64_t received_ns) {
        if (!is_streamed_pass(pass)) {
            std::fprintf(stderr, "dgr-shard-worker: pass port: dropped a message that is not a streamed ring's "
                                 "pass (Ring.stream set, deliver_to the driver's sink)\n");
            return;
        }
        streamed(pass, received_ns);
    });
}

// A streamed ring's pass: as a chained one, but nobody waits for its status, so a failure (this stage's
// own, or handing the pass on) goes to the ring's sink naming the stage it belongs to.
void ShardService::streamed(pb::ForwardRequest & req, int64_t received_ns) {
    const int32_t index = req.trace_size();
    const uint32_t ring_index = req.ring().index();
    ForwardResult r;
    pb::Hop hop;
    if (grpc::Status own = compute(req, received_ns, r, hop); !own.ok()) {
        ring_.fail(deliver_to(req), req.request_id(), ring_index, index, own, "stage " + std::to_string(index));
        return;
    }
    if (!stage_.info().last_stage) {
        const std::string address = req.downstream(0);
        hand_on(req, std::move(r), std::move(hop));  // the read loop's message: nobody reads it after us
        const ChainResult res = streams_.send(address, req);
        if (!res.status.ok()) {
            ring_.fail(deliver_to(req), req.request_id(), ring_index, index + 1, res.status,
                       "stage " + std::to_string(index + 1) + " at " + address);
        }
        return;
    }
    ring_on(req, std::move(r), std::move(hop));
}

// The rows of ``t`` from ``first`` on, ``n`` of them (a drafting ring delivers the chosen tokens' rows).
static TensorOut row_slice(TensorOut && t, int64_t first, int64_t n) {
    const size_t row_bytes = t.data.size() / (size_t) std::max<int64_t>(1, t.shape[0]);
    TensorOut out;
    out.dtype = t.dtype;
    out.shape = {n, t.shape[1]};
    out.data = t.data.substr((size_t) first * row_bytes, (size_t) n * row_bytes);
    return out;
}

void ShardService::ring_on(const pb::ForwardRequest & req, ForwardResult && r, pb::Hop && hop) {
    const pb::Ring & ring = req.ring();
    const StageInfo & in = stage_.info();
    const bool drafting = ring.draft() > 0;
    RingPass pass;
    // what the stage produced (read_args asked for picks on a token-only ring): the rows, or their picks
    pass.logits = r.has_logits ? reinterpret_cast<const float *>(r.logits.data.data()) : nullptr;
    pass.greedy = r.has_logits ? nullptr : &r.greedy;
    pass.rows = r.has_logits ? r.logits.shape[0] : (int64_t) r.greedy.size();
    pass.n_vocab = in.n_vocab;
    pass.first_position = req.positions(0);
    pass.n_positions = req.positions_size();
    pass.drafted = drafting ? (int32_t) req.drafted() : 0;
    pass.accepted = drafting ? r.accepted : 0;
    pass.drafts = &r.draft;
    pass.max_position = ring.max_position() > 0 ? std::min(ring.max_position(), in.n_ctx - 1) : in.n_ctx - 1;
    const RingStep step = ring_step(ring, pass);
    const std::chrono::milliseconds timeout(ring.pass_timeout_ms() > 0 ? ring.pass_timeout_ms() : 30000);

    pb::Delivery d;
    d.set_request_id(req.request_id());
    if (!ring.tokens_only()) {
        TensorOut logits = drafting ? row_slice(std::move(r.logits), step.first_row, (int64_t) step.tokens.size())
                                    : std::move(r.logits);  // a one-token ring delivers what it always did
        put_tensor(std::move(logits), d.mutable_reply()->mutable_logits());
    }
    d.mutable_reply()->set_compute_seconds(r.compute_seconds);
    d.mutable_reply()->set_kv_used(r.kv_used);
    d.mutable_trace()->CopyFrom(req.trace());
    pb::Hop * mine = d.add_trace();
    *mine = std::move(hop);
    pb::RingToken * chosen = d.mutable_ring();
    chosen->set_token(step.tokens.back());
    chosen->set_index(ring.index());
    chosen->set_end(step.end);
    if (drafting) {
        chosen->mutable_tokens()->Add(step.tokens.begin(), step.tokens.end());
        chosen->set_drafted((uint32_t) pass.drafted);
        d.mutable_reply()->set_accepted(r.accepted);
        d.mutable_reply()->mutable_draft()->Add(step.drafts.begin(), step.drafts.end());
    }

    if (step.end == pb::RING_CONTINUES) {
        const auto n = (uint32_t) step.tokens.size();
        pb::ForwardRequest next;
        next.set_session_id(req.session_id());
        next.set_epoch(req.epoch());
        next.add_tokens(step.tokens.back());
        next.mutable_tokens()->Add(step.drafts.begin(), step.drafts.end());
        for (int i = 0; i < next.tokens_size(); ++i) {
            next.add_positions(step.next_position + i);
        }
        // the stages still hold this pass's rejected drafts: every one takes them back first
        next.set_rewind(step.next_position < pass.first_position + pass.n_positions);
        next.set_draft(ring.draft());
        next.set_drafted((uint32_t) step.drafts.size());
        next.set_boundary_dtype(req.boundary_dtype());
        next.set_all_logits(req.all_logits());
        for (int i = 1; i < ring.stages_size(); ++i) {
            next.add_downstream(ring.stages(i));
        }
        next.set_deliver_to(req.deliver_to());
        next.set_request_id(req.request_id());
        next.set_keep_boundaries(req.keep_boundaries());
        pb::Ring * more = next.mutable_ring();
        *more = ring;
        more->set_budget(ring.budget() - n);
        more->set_index(ring.index() + n);
        mine->set_sent_ns(monotonic_ns());
        if (!ring.stream()) {
            ring_.deliver_and_start(deliver_to(req), std::move(d), ring.stages(0), std::move(next), timeout);
            return;
        }
        ring_.deliver_then_go_on(deliver_to(req), std::move(d), timeout, [&] {
            const ChainResult res = streams_.send(ring.stages(0), next);
            if (!res.status.ok()) {
                ring_.fail(deliver_to(req), req.request_id(), next.ring().index(), 0, res.status,
                           "stage 0 at " + ring.stages(0));
            }
        });
        return;
    }
    mine->set_sent_ns(monotonic_ns());
    ring_.deliver(deliver_to(req), std::move(d), timeout);
}

grpc::Status ShardService::Reset(grpc::ServerContext *, const pb::ResetRequest * req, pb::ResetReply * reply) {
    return guarded("Reset", [&] { reply->set_existed(stage_.reset(req->session_id())); });
}

grpc::Status ShardService::Session(grpc::ServerContext *, const pb::SessionRequest * req, pb::SessionReply * reply) {
    return guarded("Session", [&] {
        const SessionFigures f = stage_.session_figures(req->session_id());
        reply->set_epoch(f.epoch);
        reply->set_n_past(f.n_past);
        reply->set_state_bytes(f.state_bytes);
    });
}

grpc::Status ShardService::Health(grpc::ServerContext *, const pb::HealthRequest *, pb::HealthReply * reply) {
    return guarded("Health", [&] {
        reply->set_serving(true);
        reply->set_status("serving, " + std::to_string(stage_.n_sessions()) + " session(s)");
    });
}

grpc::Status ShardService::Tokenize(grpc::ServerContext *, const pb::TokenizeRequest * req, pb::TokenizeReply * reply) {
    return guarded("Tokenize", [&] {
        for (int32_t t : stage_.tokenize(req->text(), req->add_special())) {
            reply->add_tokens(t);
        }
    });
}

grpc::Status ShardService::Detokenize(grpc::ServerContext *, const pb::DetokenizeRequest * req,
                                      pb::DetokenizeReply * reply) {
    return guarded("Detokenize", [&] {
        reply->set_text(stage_.detokenize(std::vector<int32_t>(req->tokens().begin(), req->tokens().end())));
    });
}

}  // namespace dgr
