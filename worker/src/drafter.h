// The last stage's MTP drafter (docs/mtp.md): DeepSeek-V4's nextn block, run in a llama context of its
// own (LLAMA_CONTEXT_TYPE_MTP) per session, beside the session's main context.
//
// The block at position q reads the main model's hidden state at q - 1 (n_embd_out wide: the
// hyper-connection residual) paired with the token at q, and predicts the token at q + 1. After every
// main pass the drafter catches up on the pass's accepted positions, so its KV always ends where the
// session's accepted continuation does; drafting then runs the block k times from the last accepted
// hidden state and the bonus token, and takes its own draft positions back before it returns.
// Not thread-safe: the Stage calls it under its mutex.
#pragma once

#include <cstdint>
#include <vector>

struct llama_model;
struct llama_context;

namespace dgr {

class MtpDrafter {
public:
    MtpDrafter(llama_model * model, int32_t n_ctx, int32_t n_batch, int32_t n_threads);  // throws
    ~MtpDrafter();
    MtpDrafter(const MtpDrafter &) = delete;
    MtpDrafter & operator=(const MtpDrafter &) = delete;

    void clear();  // a route change or a released session: nothing held
    // Positions from ``from`` on go (a rewinding Forward).  Within the last catch-up (a ring that ended
    // inside its pass's accepted drafts) the block's input state goes back with them.
    void rewind(int32_t from);
    // ``main`` just computed positions [p, p + n) with every row an output (h_nextn); the first
    // ``valid`` of them are the session's continuation (the rest: rejected drafts).
    void catch_up(llama_context * main, const std::vector<int32_t> & tokens, int32_t p, int32_t valid);
    // Up to k tokens after ``bonus`` (the token at ``position``), greedy; the KV is left as before.
    std::vector<int32_t> draft(int32_t bonus, int32_t position, int32_t k);

private:
    int32_t decode_rows(const int32_t * tokens, const float * h_rows, int32_t p, int32_t n);  // llama rc

    llama_context * ctx_ = nullptr;
    int32_t width_ = 0;  // n_embd_out: the hidden rows the block reads
    int32_t n_vocab_ = 0;
    std::vector<float> pending_h_;  // the main hidden state at the last accepted position
    std::vector<float> caught_h_;   // the rows the last catch-up fed: row i at position caught_p_ + i
    int32_t caught_p_ = 0;
};

// Greedy acceptance as the driver computes it (pipeline/speculative.accept): how many of the last
// ``drafted`` tokens stand, each checked against the argmax of the row before it.
// ``main`` holds the logits of every row of the pass that fed ``tokens``.
int32_t accepted_drafts(llama_context * main, const std::vector<int32_t> & tokens, int32_t drafted, int32_t n_vocab);

}  // namespace dgr
