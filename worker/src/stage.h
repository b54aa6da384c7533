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
#include "stage_types.h"
#include "state_census.h"

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
    SessionFigures session_figures(const std::string & session_id);  // throws NotFound for no such session
    std::vector<int32_t> tokenize(const std::string & text, bool add_special);
    std::string detokenize(const std::vector<int32_t> & tokens);
    size_t n_sessions();
    std::vector<LayerState> census() const;  // --census: what the passes filled so far; else empty

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
    std::unique_ptr<StateCensus> census_;     // --census only
};

}  // namespace dgr
