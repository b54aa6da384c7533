// One pipeline stage: the patched libllama model (owned layers only) and per-session KV contexts.
//
// Thread-safety: every public method that touches llama or the sessions takes one mutex, so llama
// calls are serialised. gRPC may call from many threads; a stage computes one batch at a time anyway
// (the CPU threads are all busy), and serialising keeps results independent of request interleaving.
// At more than one thread, forward() computes on the stage's one compute thread (compute_thread.h).
// info() is fixed once the constructor returns, so it is read without the mutex.
#pragma once

#include "compute_thread.h"
#include "drafter.h"
#include "llama.h"
#include "options.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

struct llama_model;
struct llama_context;

namespace dgr {

// Request errors, each mapped to one gRPC status code by the service.
struct StageError : std::runtime_error {
    enum class Kind { InvalidArgument, FailedPrecondition, NotFound, ResourceExhausted, PermissionDenied, Internal };
    Kind kind;
    StageError(Kind k, const std::string & msg) : std::runtime_error(msg), kind(k) {}
};

enum class DType { F32, F16 };

struct TensorIn {  // a boundary coming in: [n_tokens, width] row-major little-endian
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    const std::string * data = nullptr;
};

struct ForwardArgs {
    std::string session_id;
    uint64_t epoch = 0;
    std::vector<int32_t> positions;
    std::vector<int32_t> tokens;
    bool has_boundary = false;
    TensorIn boundary;
    DType boundary_dtype = DType::F32;  // of the boundary we return
    bool all_logits = false;
    std::vector<int32_t> capture_layers;
    bool rewind = false;  // positions[0] may take back up to max_rewind held positions
    int32_t draft = 0;    // MTP last stage: draft this many tokens after the pass
    int32_t drafted = 0;  // MTP last stage: the pass's last tokens are drafts to verify
    // last stage of a token-only ring: the argmax of each output row (ForwardResult::greedy) instead of
    // the rows, which nobody reads; picked under the stage's lock, so the rows need not be copied out
    bool greedy_only = false;
};

struct TensorOut {
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    std::string data;
};

struct ForwardResult {
    bool has_boundary = false;
    TensorOut boundary;
    bool has_logits = false;
    TensorOut logits;
    std::vector<int32_t> greedy;  // with greedy_only: the argmax of each output row, in order
    std::vector<std::pair<int32_t, TensorOut>> captures;
    double compute_seconds = 0.0;
    int32_t kv_used = 0;
    std::vector<int32_t> draft;  // MTP last stage: the drafted tokens
    int32_t accepted = 0;        // MTP last stage: the pass's drafts that stood
};

struct MemoryFigures {
    uint64_t weight_bytes = 0;
    uint64_t kv_bytes = 0;
    uint64_t compute_bytes = 0;
    std::string load_mode;  // llama's name of the mode the weights were loaded with (weights.h)
};

struct StageInfo {
    std::string architecture;
    std::string backend_devices;
    int32_t n_layer = 0, layer_begin = 0, layer_end = 0;
    bool first_stage = false, last_stage = false;
    bool has_token_embd = false, has_output_head = false;
    int32_t n_embd = 0, boundary_width = 0, n_vocab = 0;
    int32_t n_ctx = 0, n_batch = 0, n_threads = 0, max_rewind = 0;
    std::string cpus;  // --cpus as given; "": free to run anywhere
    bool needs_token_sideband = false;
    bool mtp = false;  // the last stage drafts with the nextn block
    MemoryFigures memory;
};

class Stage {
public:
    // Loads the model range and one session context (so Info can report KV bytes); throws on failure.
    explicit Stage(const WorkerOptions & opts);
    ~Stage();
    Stage(const Stage &) = delete;
    Stage & operator=(const Stage &) = delete;

    const StageInfo & info() const { return info_; }  // immutable after construction: no lock
    ForwardResult forward(const ForwardArgs & args);
    bool reset(const std::string & session_id);
    std::vector<int32_t> tokenize(const std::string & text, bool add_special);
    std::string detokenize(const std::vector<int32_t> & tokens);
    size_t n_sessions();

private:
    struct Session {
        uint64_t epoch = 0;
        llama_context * ctx = nullptr;
        int32_t n_past = 0;
        std::unique_ptr<MtpDrafter> mtp;  // --mtp last stage only
    };

    struct SessionPlan {         // what an accepted Forward will do to its session
        bool is_new = false;     // takes a slot and a context
        bool new_epoch = false;  // route change: the session's KV is wiped
        int32_t n_past = 0;      // positions the session holds before this request
        int32_t rewind_to = -1;  // >= 0: remove the positions from here on first (a rewind)
    };

    ForwardResult forward_here(const ForwardArgs & args);  // forward() on the thread that computes
    llama_context * acquire_context();                     // from the idle pool, or a new one
    llama_context_params context_params() const;           // every session context's
    void refuse_unless_context_fits(const llama_model_params & mp) const;
    void release_context(llama_context * ctx);
    SessionPlan plan_session(const ForwardArgs & args, int32_t n_tokens) const;  // throws; changes nothing
    Session & session_for(const ForwardArgs & args, const SessionPlan & plan);
    void check_request(const ForwardArgs & args, int32_t n_tokens) const;
    void check_rewind(const ForwardArgs & args, int32_t n_past) const;
    void check_draft(const ForwardArgs & args, int32_t n_tokens) const;
    void draft_after(Session & s, const ForwardArgs & args, ForwardResult & r);
    void load_mtp_model();   // --mtp-model: the MTP-only GGUF, checked against the main model
    void check_mtp() const;  // --mtp / --mtp-model: the last stage, with a nextn block
    llama_model * drafting_model() const { return mtp_model_ ? mtp_model_ : model_; }

    WorkerOptions opts_;
    std::mutex mu_;
    llama_model * model_ = nullptr;
    llama_model * mtp_model_ = nullptr;  // --mtp-model only: the nextn block's own file
    std::vector<llama_context *> idle_;
    std::map<std::string, Session> sessions_;
    StageInfo info_;
    std::atomic<size_t> n_sessions_{0};       // readable without the mutex (Health during a Forward)
    std::unique_ptr<ComputeThread> compute_;  // null at one thread: the caller's thread computes
};

}  // namespace dgr
