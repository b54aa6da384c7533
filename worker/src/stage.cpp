#include "stage.h"

#include "memory_fit.h"
#include "memory_layers.h"
#include "request_checks.h"

#include "argmax.h"  // greedy_token
#include "weights.h"

#include "ggml-backend.h"
#include "ggml.h"
#include "llama-ext.h"  // staging API of the pinned tree: layer-input capture, memory breakdown
#include "llama.h"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace dgr {

using Kind = StageError::Kind;

static std::string meta_str(const llama_model * model, const char * key) {
    char buf[256];
    return llama_model_meta_val_str(model, key, buf, sizeof(buf)) >= 0 ? std::string(buf) : std::string();
}

static_assert(sizeof(ggml_fp16_t) == 2, "dtype_size (request_checks.cpp) counts an F16 element as 2 bytes");

// F32 rows in, the requested dtype out.
static TensorOut make_tensor(const float * src, int64_t rows, int64_t width, DType dtype) {
    TensorOut t;
    t.dtype = dtype;
    t.shape = {rows, width};
    const int64_t n = rows * width;
    t.data.resize((size_t) n * dtype_size(dtype));
    if (dtype == DType::F16) {
        ggml_fp32_to_fp16_row(src, reinterpret_cast<ggml_fp16_t *>(&t.data[0]), n);
    } else {
        std::memcpy(&t.data[0], src, (size_t) n * sizeof(float));
    }
    return t;
}

// Whether a later stage takes the token ids next to the boundary: where the model reads them past its first
// layer. DeepSeek-V4's hash-routed MoE layers (the first <arch>.hash_layer_count) pick their experts by
// them; CogVLM's builder picks its text or its vision expert's weights by whether a batch carries token
// ids at all, a choice made outside the graph, so the stage cut (patch 0002) cannot see it.
static bool needs_token_ids(const llama_model * model, const StageInfo & in) {
    const std::string hash_layers = meta_str(model, (in.architecture + ".hash_layer_count").c_str());
    const bool hash_routed = !hash_layers.empty() && in.layer_begin < std::stoi(hash_layers);
    return !in.first_stage && (hash_routed || in.architecture == "cogvlm");
}

// A later stage's rows are embeddings, for which an M-RoPE model reads one position per RoPE section (an
// image's layout) where it broadcasts a token's one: the text positions, once per section (empty: as sent).
static std::vector<llama_pos> position_sections(const StageInfo & in, const std::vector<int32_t> & positions) {
    std::vector<llama_pos> sections;
    if (in.first_stage || in.positions_per_row == 1) {
        return sections;
    }
    for (int32_t k = 0; k < in.positions_per_row; ++k) {
        sections.insert(sections.end(), positions.begin(), positions.end());
    }
    return sections;
}

Stage::Stage(const WorkerOptions & opts) : opts_(opts), census_(opts.census ? new StateCensus() : nullptr) {
    llama_model_params mp = llama_model_default_params();
    mp.layer_begin = opts.layer_begin;
    mp.layer_end = opts.layer_end;
    mp.n_gpu_layers = opts.n_gpu_layers;
    mp.load_mode = choose_load_mode(opts.load_mode, opts.n_gpu_layers);
    info_.memory.load_mode = llama_load_mode_name(mp.load_mode);
    // the loader keeps nextn tensors only for the range that owns the output; with --mtp-model the block
    // comes from its own file, so a main file that also holds one keeps it out
    mp.load_mtp = opts.mtp && opts.mtp_model_path.empty();
    model_ = llama_model_load_from_file(opts.model_path.c_str(), mp);
    if (model_ == nullptr) {
        throw std::runtime_error("failed to load layers " + std::to_string(opts.layer_begin) + ":" +
                                 (opts.layer_end < 0 ? std::string("end") : std::to_string(opts.layer_end)) + " of " +
                                 opts.model_path + " (see the llama log above)");
    }

    StageInfo & in = info_;
    in.architecture = meta_str(model_, "general.architecture");
    in.n_layer = llama_model_n_layer(model_);
    in.layer_begin = opts.layer_begin;
    in.layer_end = opts.layer_end < 0 ? in.n_layer : opts.layer_end;
    in.first_stage = in.layer_begin == 0;
    in.last_stage = in.layer_end == in.n_layer;
    in.n_embd = llama_model_n_embd(model_);
    // a stage before the last outputs its last layer's output as its embeddings (patch 0002): n_embd_out
    // floats a token, the hyper-connection state for DeepSeek V4
    in.boundary_width = llama_model_n_embd_out(model_);
    const llama_rope_type rope = llama_model_rope_type(model_);
    in.positions_per_row = rope == LLAMA_ROPE_TYPE_MROPE || rope == LLAMA_ROPE_TYPE_IMROPE ? 4 : 1;
    in.n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model_));
    in.n_ctx = opts.n_ctx;
    in.n_batch = opts.n_batch;
    in.n_threads = opts.n_threads;
    in.cpus = opts.cpus_text;
    in.max_rewind = opts.max_rewind;
    in.needs_token_sideband = needs_token_ids(model_, in);

    if (!opts.mtp_model_path.empty() && in.last_stage) {
        load_mtp_model();
    }
    check_mtp();
    in.mtp = opts.mtp;

    std::string devs;
    for (int i = 0; i < llama_model_n_devices(model_); ++i) {
        ggml_backend_dev_t d = llama_model_get_device(model_, i);
        devs += (devs.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(d)) + " (" +
                ggml_backend_dev_description(d) + ")";
    }
    in.backend_devices = devs.empty() ? "CPU" : devs + ", CPU";

    if (!ComputeThread::inline_for(opts_.n_threads)) {
        compute_ = std::make_unique<ComputeThread>();
    }
    refuse_unless_context_fits(mp);
    // one context up front: fails fast when KV/compute cannot be allocated, and gives Info its figures
    idle_.push_back(acquire_context());
    // the MTP-only file's block, embedding and head are this stage's weights too (docs/mtp.md)
    in.memory.weight_bytes = llama_model_size(model_) + (mtp_model_ ? llama_model_size(mtp_model_) : 0);
    for (const auto & [buft, mb] : llama_get_memory_breakdown(idle_.back())) {
        (void) buft;
        in.memory.kv_bytes += mb.context;
        in.memory.compute_bytes += mb.compute;
    }
    const MemoryLayers by_layer = memory_layers(idle_.back(), in.memory.kv_bytes);
    in.memory.kv_bytes_by_layer = by_layer.bytes_by_layer;
    in.memory.kv_unread_bytes = by_layer.unread_bytes;
    in.names_layer_outputs = by_layer.names_layer_outputs;
}

Stage::~Stage() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto & [id, s] : sessions_) {
        (void) id;
        llama_free(s.ctx);
    }
    sessions_.clear();
    for (auto * ctx : idle_) {
        llama_free(ctx);
    }
    idle_.clear();
    if (mtp_model_) {
        llama_model_free(mtp_model_);
    }
    if (model_) {
        llama_model_free(model_);
    }
}

// V4 Flash's nextn block never goes into the main file: the pinned converter's --mtp writes it alone,
// with the main token embedding and output head beside it, and the pinned loader reads such an MTP-only
// file (its trunk tensors are optional). The block reads the main model's hidden rows and scores drafts
// against the main vocabulary, so both must match; anything else is a different model's head.
void Stage::load_mtp_model() {
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = opts_.n_gpu_layers;
    mp.load_mode = choose_load_mode(opts_.load_mode, opts_.n_gpu_layers);
    mp.load_mtp = true;
    const std::string & path = opts_.mtp_model_path;
    mtp_model_ = llama_model_load_from_file(path.c_str(), mp);
    if (mtp_model_ == nullptr) {
        throw std::runtime_error("--mtp-model: failed to load " + path + " (see the llama log above)");
    }
    auto refuse = [&](const std::string & what, const std::string & main, const std::string & mtp) {
        throw std::runtime_error("--mtp-model: " + path + " is not this model's MTP file: " + what + " " + mtp +
                                 ", the main model's " + main);
    };
    const std::string arch = meta_str(mtp_model_, "general.architecture");
    if (arch != info_.architecture) {
        refuse("architecture", info_.architecture, arch);
    }
    if (llama_model_n_embd_out(mtp_model_) != llama_model_n_embd_out(model_)) {
        refuse("hidden width", std::to_string(llama_model_n_embd_out(model_)),
               std::to_string(llama_model_n_embd_out(mtp_model_)));
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(mtp_model_));
    if (n_vocab != info_.n_vocab) {
        refuse("vocabulary of", std::to_string(info_.n_vocab), std::to_string(n_vocab));
    }
}

void Stage::check_mtp() const {
    if (!opts_.mtp) {
        return;
    }
    const std::string flag = opts_.mtp_model_path.empty() ? "--mtp" : "--mtp-model";
    if (!info_.last_stage) {
        throw std::runtime_error(flag + ": only the last stage drafts (its range must end at layer " +
                                 std::to_string(info_.n_layer) + ")");
    }
    if (llama_model_n_layer_nextn(drafting_model()) < 1) {
        throw std::runtime_error(flag + ": " + (mtp_model_ ? opts_.mtp_model_path : opts_.model_path) +
                                 " holds no nextn (MTP) block");
    }
}

llama_context * Stage::acquire_context() {
    if (!idle_.empty()) {
        llama_context * ctx = idle_.back();
        idle_.pop_back();
        return ctx;
    }
    llama_context * ctx = llama_init_from_model(model_, context_params());
    if (ctx == nullptr) {
        throw StageError(Kind::ResourceExhausted,
                         "could not create a session context (n_ctx " + std::to_string(opts_.n_ctx) + ")");
    }
    if (opts_.mtp) {
        llama_set_embeddings_nextn(ctx, true, /*masked*/ false);  // every row's hidden state: the block reads them
    }
    return ctx;
}

void Stage::refuse_unless_context_fits(const llama_model_params & mp) const {
    const std::optional<Shortfall> short_of = context_shortfall(opts_.model_path, mp, context_params());
    if (!short_of) {
        return;
    }
    const Shortfall & s = *short_of;
    throw std::runtime_error("layers " + std::to_string(info_.layer_begin) + ":" + std::to_string(info_.layer_end) +
                             " cannot hold a context of " + std::to_string(opts_.n_ctx) + " positions: it needs " +
                             std::to_string(s.need) + " bytes of " + s.device + " (KV " + std::to_string(s.kv) +
                             ", compute " + std::to_string(s.compute) + "), which has " + std::to_string(s.have) +
                             " bytes free");
}

llama_context_params Stage::context_params() const {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) opts_.n_ctx;
    // n_ubatch == n_batch: every Forward is one ubatch, so the kernels (and their rounding) depend only
    // on the request, identically on every stage and on the monolithic reference
    cp.n_batch = (uint32_t) opts_.n_batch;
    cp.n_ubatch = (uint32_t) opts_.n_batch;
    cp.n_seq_max = 1;  // one context per session: KV occupancy never depends on other sessions
    // rolling state (DeepSeek-V4's compressor) keeps this many per-token snapshots so a rewind can undo
    // them; llama clamps it to 0 where the KV is plain and any trailing positions can simply be removed
    cp.n_rs_seq = (uint32_t) opts_.max_rewind;
    cp.n_threads = opts_.n_threads;
    cp.n_threads_batch = opts_.n_threads;
    // a stage before the last hands on its residual as its embeddings, every token's, unpooled
    cp.embeddings = !info_.last_stage;
    cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
    cp.no_perf = true;
    if (census_) {
        cp.cb_eval = &StateCensus::observe;
        cp.cb_eval_user_data = census_.get();
    }
    return cp;
}

void Stage::release_context(llama_context * ctx) {
    llama_memory_clear(llama_get_memory(ctx), true);
    idle_.push_back(ctx);
}

size_t Stage::n_sessions() {
    return n_sessions_.load();
}

std::vector<LayerState> Stage::census() const {
    return census_ ? census_->snapshot() : std::vector<LayerState>{};
}

bool Stage::reset(const std::string & session_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
        return false;
    }
    release_context(it->second.ctx);
    sessions_.erase(it);
    n_sessions_ = sessions_.size();
    return true;
}

// The session's state as llama would save it, sized by a dry run of that save (no copy): its cache rows
// of the owned layers and their cells' metadata, the rolling and compressed caches of architectures that
// keep them included. What a session costs in memory, measured (issue 45: the catalog's KV bytes per token).
SessionFigures Stage::session_figures(const std::string & session_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) {
        throw StageError(Kind::NotFound, "unknown session '" + session_id + "'");
    }
    SessionFigures f;
    f.epoch = it->second.epoch;
    f.n_past = it->second.n_past;
    f.state_bytes = llama_state_seq_get_size(it->second.ctx, 0);
    return f;
}

// Every check a Forward must pass, against the session as it is, before anything changes: a rejected
// request (from any client: the worker has no authentication) never takes a session slot, wipes a live
// session's KV on a higher epoch, nor leaves anything behind.
Stage::SessionPlan Stage::plan_session(const ForwardArgs & a, int32_t n_tokens) const {
    check_positions(a, n_tokens);
    const int32_t p0 = a.positions.front();
    SessionPlan plan;
    auto it = sessions_.find(a.session_id);
    if (it == sessions_.end()) {
        if (p0 != 0) {
            throw StageError(Kind::NotFound, "unknown session '" + a.session_id +
                                                 "' (a new session starts at position 0, got " + std::to_string(p0) +
                                                 ")");
        }
        if ((int32_t) sessions_.size() >= opts_.max_sessions) {
            throw StageError(Kind::ResourceExhausted,
                             "too many sessions (" + std::to_string(sessions_.size()) +
                                 "); Reset one or start the worker with a larger --max-sessions");
        }
        plan.is_new = true;
    } else {
        const Session & s = it->second;
        if (a.epoch < s.epoch) {
            throw StageError(Kind::FailedPrecondition, "stale epoch " + std::to_string(a.epoch) + " for session '" +
                                                           a.session_id + "' (current epoch " +
                                                           std::to_string(s.epoch) + ")");
        }
        // a higher epoch is a route change: this stage's KV belongs to the old route and goes once the
        // request is accepted; the caller re-prefills from 0
        plan.new_epoch = a.epoch > s.epoch;
        plan.n_past = plan.new_epoch ? 0 : s.n_past;
    }
    if (a.rewind && !plan.is_new && !plan.new_epoch && p0 < plan.n_past) {
        check_rewind(info_, a, plan.n_past);
        plan.rewind_to = p0;
        plan.n_past = p0;
    }
    if (p0 != plan.n_past) {
        throw StageError(Kind::FailedPrecondition, "positions must continue session '" + a.session_id + "' epoch " +
                                                       std::to_string(a.epoch) + " at " + std::to_string(plan.n_past) +
                                                       ", got " + std::to_string(p0) +
                                                       (p0 > plan.n_past ? " (gap)" : " (out of order)"));
    }
    if ((int64_t) plan.n_past + n_tokens > info_.n_ctx) {
        throw StageError(Kind::ResourceExhausted,
                         "context overflow: session '" + a.session_id + "' holds " + std::to_string(plan.n_past) +
                             " positions, +" + std::to_string(n_tokens) + " > n_ctx " + std::to_string(info_.n_ctx));
    }
    return plan;
}

// The accepted request's state change: a new session's slot and context, or a route change's KV wipe.
Stage::Session & Stage::session_for(const ForwardArgs & a, const SessionPlan & plan) {
    if (plan.is_new) {
        Session s;
        s.epoch = a.epoch;
        s.ctx = acquire_context();  // may throw (no memory): nothing inserted yet
        if (info_.mtp) {
            try {
                s.mtp = std::make_unique<MtpDrafter>(drafting_model(), opts_.n_ctx, opts_.n_batch, opts_.n_threads);
            } catch (const std::exception & e) {
                release_context(s.ctx);
                throw StageError(Kind::ResourceExhausted, e.what());
            }
        }
        auto it = sessions_.emplace(a.session_id, std::move(s)).first;
        n_sessions_ = sessions_.size();
        return it->second;
    }
    Session & s = sessions_.at(a.session_id);
    if (plan.rewind_to >= 0) {
        // the rejected drafts' KV (and, with rolling state, their snapshots) go before anything runs
        if (!llama_memory_seq_rm(llama_get_memory(s.ctx), 0, plan.rewind_to, -1)) {
            throw StageError(Kind::FailedPrecondition, "llama could not take session '" + a.session_id +
                                                           "' back to position " + std::to_string(plan.rewind_to) +
                                                           " (from " + std::to_string(s.n_past) + ")");
        }
        s.n_past = plan.rewind_to;
        if (s.mtp) {
            s.mtp->rewind(plan.rewind_to);
        }
    }
    if (plan.new_epoch) {
        llama_memory_clear(llama_get_memory(s.ctx), true);
        if (s.mtp) {
            s.mtp->clear();
        }
        s.epoch = a.epoch;
        s.n_past = 0;
    }
    return s;
}

// Capture flags live on the (pooled) context: set for one decode, cleared on every way out, throws included.
namespace {
struct CaptureFlags {
    llama_context * ctx;
    const std::vector<int32_t> & layers;
    CaptureFlags(llama_context * c, const std::vector<int32_t> & l) : ctx(c), layers(l) {
        for (int32_t layer : layers) {
            llama_set_embeddings_layer_inp(ctx, (uint32_t) layer, true);
        }
    }
    ~CaptureFlags() {
        for (int32_t layer : layers) {
            llama_set_embeddings_layer_inp(ctx, (uint32_t) layer, false);
        }
    }
    CaptureFlags(const CaptureFlags &) = delete;
    CaptureFlags & operator=(const CaptureFlags &) = delete;
};
}  // namespace

ForwardResult Stage::forward(const ForwardArgs & a) {
    if (compute_) {
        return compute_->run([&] { return forward_here(a); });
    }
    return forward_here(a);
}

ForwardResult Stage::forward_here(const ForwardArgs & a) {
    std::lock_guard<std::mutex> lock(mu_);
    const StageInfo & in = info_;
    const int32_t n_tokens = (int32_t) a.positions.size();
    check_request(info_, a, n_tokens);
    check_draft(info_, a, n_tokens);
    const SessionPlan plan = plan_session(a, n_tokens);  // validate first ...
    Session & s = session_for(a, plan);                  // ... then mutate

    const bool want_all = a.all_logits;
    llama_batch batch = llama_batch_init(n_tokens, in.first_stage ? 0 : in.boundary_width, 1);
    batch.n_tokens = n_tokens;
    if (in.needs_token_sideband) {
        // llama_batch_init allocates no token array next to embd; llama_batch_free releases this one
        batch.token = static_cast<llama_token *>(malloc(sizeof(llama_token) * (size_t) n_tokens));
    }
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (in.first_stage || in.needs_token_sideband) {
            batch.token[i] = a.tokens[i];
        }
        batch.pos[i] = a.positions[i];
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        // with MTP the rows that judge the drafts are outputs too (the nextn block reads every row's hidden
        // state without them: embeddings_nextn unmasked), so a plain pass computes what it would without MTP;
        // a stage before the last outputs every row (its residual, as embeddings: llama warns otherwise)
        const bool judged = want_all || i == n_tokens - 1 || (in.mtp && i >= n_tokens - a.drafted - 1);
        batch.logits[i] = !in.last_stage || judged;
    }
    if (!in.first_stage) {
        const int64_t n = (int64_t) n_tokens * in.boundary_width;
        if (a.boundary.dtype == DType::F16) {
            ggml_fp16_to_fp32_row(reinterpret_cast<const ggml_fp16_t *>(a.boundary.data->data()), batch.embd, n);
        } else {
            std::memcpy(batch.embd, a.boundary.data->data(), (size_t) n * sizeof(float));
        }
    }

    const auto t0 = std::chrono::steady_clock::now();
    ForwardResult r;
    CaptureFlags capture(s.ctx, a.capture_layers);
    const std::vector<llama_pos> sections = position_sections(in, a.positions);
    llama_pos * own_positions = batch.pos;
    batch.pos = sections.empty() ? own_positions : const_cast<llama_pos *>(sections.data());
    const int32_t rc = llama_decode(s.ctx, batch);
    batch.pos = own_positions;
    llama_batch_free(batch);

    if (rc == 0) {
        s.n_past += n_tokens;
        if (in.last_stage) {
            const int32_t rows = want_all ? n_tokens : 1;  // every row, or the last one
            const auto row = [&](int32_t j) { return llama_get_logits_ith(s.ctx, want_all ? j : n_tokens - 1); };
            if (a.greedy_only) {
                // a token-only ring reads each row once, to pick: pick here instead of copying 4 x n_vocab
                // bytes per row out (a 128 KiB copy per token on tiny-llama, 1.3% of its decode)
                for (int32_t j = 0; j < rows; ++j) {
                    r.greedy.push_back(greedy_token(row(j), in.n_vocab));
                }
            } else {
                // rows straight into the reply's bytes: llama_get_logits_ith rows need not be adjacent
                const size_t row_bytes = (size_t) in.n_vocab * sizeof(float);
                r.has_logits = true;
                r.logits.shape = {rows, in.n_vocab};
                r.logits.data.resize((size_t) rows * row_bytes);
                for (int32_t j = 0; j < rows; ++j) {
                    std::memcpy(&r.logits.data[(size_t) j * row_bytes], row(j), row_bytes);
                }
            }
        } else {
            const float * b = llama_get_embeddings(s.ctx);
            if (b == nullptr) {
                throw StageError(Kind::Internal, "llama produced no boundary for a non-last stage");
            }
            r.has_boundary = true;
            r.boundary = make_tensor(b, n_tokens, in.boundary_width, a.boundary_dtype);
        }
        for (int32_t l : a.capture_layers) {
            const float * c = llama_get_embeddings_layer_inp(s.ctx, (uint32_t) l);
            if (c == nullptr) {
                throw StageError(Kind::Internal, "llama captured no residual for layer " + std::to_string(l));
            }
            r.captures.emplace_back(l, make_tensor(c, n_tokens, in.n_embd, DType::F32));
        }
    }
    r.compute_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    if (rc == 1) {
        throw StageError(Kind::ResourceExhausted, "no KV slot for " + std::to_string(n_tokens) + " positions");
    }
    if (rc != 0) {
        throw StageError(Kind::Internal, "llama_decode failed with code " + std::to_string(rc));
    }
    r.kv_used = s.n_past;
    if (in.mtp) {
        draft_after(s, a, r);
    }
    return r;
}

// The MTP half of a last-stage pass: accept the pass's drafts, let the nextn block catch up on the
// accepted positions, then draft what follows them. A failure here fails the pass (the driver then
// sees an error, never wrong drafts).
void Stage::draft_after(Session & s, const ForwardArgs & a, ForwardResult & r) {
    const int32_t n = (int32_t) a.positions.size();
    r.accepted = accepted_drafts(s.ctx, a.tokens, a.drafted, info_.n_vocab);
    const int32_t valid = n - a.drafted + r.accepted;
    try {
        s.mtp->catch_up(s.ctx, a.tokens, a.positions.front(), valid);
        if (a.draft > 0) {
            const int32_t bonus = greedy_token(llama_get_logits_ith(s.ctx, valid - 1), info_.n_vocab);
            r.draft = s.mtp->draft(bonus, a.positions.front() + valid, a.draft);
        }
    } catch (const std::runtime_error & e) {
        throw StageError(Kind::Internal, e.what());
    }
}

std::vector<int32_t> Stage::tokenize(const std::string & text, bool add_special) {
    std::lock_guard<std::mutex> lock(mu_);
    const llama_vocab * vocab = llama_model_get_vocab(model_);
    std::vector<llama_token> out(text.size() + 8);
    int32_t n =
        llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special, false);
    if (n < 0) {
        out.resize((size_t) -n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), add_special,
                           false);
    }
    if (n < 0) {
        throw StageError(Kind::Internal, "tokenize failed");
    }
    out.resize((size_t) n);
    return std::vector<int32_t>(out.begin(), out.end());
}

std::string Stage::detokenize(const std::vector<int32_t> & tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    const llama_vocab * vocab = llama_model_get_vocab(model_);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (int32_t t : tokens) {
        if (t < 0 || t >= n_vocab) {
            throw StageError(Kind::InvalidArgument, "token id " + std::to_string(t) + " outside the vocabulary");
        }
    }
    std::string text(tokens.size() * 8 + 16, '\0');
    int32_t n =
        llama_detokenize(vocab, tokens.data(), (int32_t) tokens.size(), &text[0], (int32_t) text.size(), false, false);
    if (n < 0) {
        text.resize((size_t) -n);
        n = llama_detokenize(vocab, tokens.data(), (int32_t) tokens.size(), &text[0], (int32_t) text.size(), false,
                             false);
    }
    if (n < 0) {
        throw StageError(Kind::Internal, "detokenize failed");
    }
    text.resize((size_t) n);
    return text;
}

}  // namespace dgr
