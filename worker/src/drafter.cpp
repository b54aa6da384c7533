#include "drafter.h"

#include "argmax.h"  // greedy_token: numpy's argmax rule, as the driver's

#include "llama-ext.h"  // staging API of the pinned tree: nextn hidden states
#include "llama.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace dgr {

MtpDrafter::MtpDrafter(llama_model * model, int32_t n_ctx, int32_t n_batch, int32_t n_threads) {
    llama_context_params cp = llama_context_default_params();
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cp.n_ctx = (uint32_t) n_ctx;
    cp.n_batch = (uint32_t) n_batch;
    cp.n_ubatch = (uint32_t) n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.no_perf = true;
    ctx_ = llama_init_from_model(model, cp);
    if (ctx_ == nullptr) {
        throw std::runtime_error("could not create the MTP context (does the model hold a nextn block?)");
    }
    llama_set_embeddings_nextn(ctx_, true, /*masked*/ true);  // the block's own hidden state chains drafts
    width_ = llama_model_n_embd_out(model);
    n_vocab_ = llama_vocab_n_tokens(llama_model_get_vocab(model));
    pending_h_.assign((size_t) width_, 0.0f);
}

MtpDrafter::~MtpDrafter() {
    if (ctx_) {
        llama_free(ctx_);
    }
}

void MtpDrafter::clear() {
    llama_memory_clear(llama_get_memory(ctx_), true);
    pending_h_.assign((size_t) width_, 0.0f);
    caught_h_.clear();
}

void MtpDrafter::rewind(int32_t from) {
    const int32_t held = llama_memory_seq_pos_max(llama_get_memory(ctx_), 0) + 1;
    if (held > from && !llama_memory_seq_rm(llama_get_memory(ctx_), 0, from, -1)) {
        throw std::runtime_error("llama could not take the MTP context back to position " + std::to_string(from));
    }
    const int64_t row = (int64_t) from - caught_p_;
    if (from < held && row >= 0 && (row + 1) * width_ <= (int64_t) caught_h_.size()) {
        // position ``from`` pairs h(from - 1) with its token: the row the catch-up fed there
        std::memcpy(pending_h_.data(), &caught_h_[(size_t) (row * width_)], sizeof(float) * (size_t) width_);
    }
}

int32_t MtpDrafter::decode_rows(const int32_t * tokens, const float * h_rows, int32_t p, int32_t n) {
    llama_batch batch = llama_batch_init(n, width_, 1);
    // llama_batch_init allocates embd or token, not both; the block reads both (llama_batch_free frees it)
    batch.token = static_cast<llama_token *>(malloc(sizeof(llama_token) * (size_t) n));
    batch.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        batch.token[i] = tokens[i];
        batch.pos[i] = p + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = i == n - 1;
    }
    std::memcpy(batch.embd, h_rows, sizeof(float) * (size_t) n * (size_t) width_);
    const int32_t rc = llama_decode(ctx_, batch);
    llama_batch_free(batch);
    return rc;
}

void MtpDrafter::catch_up(llama_context * main, const std::vector<int32_t> & tokens, int32_t p, int32_t valid) {
    // the block at q pairs h(q - 1) with token q: row 0 takes the last pass's pending state
    std::vector<float> h((size_t) valid * (size_t) width_);
    std::memcpy(h.data(), pending_h_.data(), sizeof(float) * (size_t) width_);
    for (int32_t i = 0; i + 1 < valid; ++i) {
        const float * row = llama_get_embeddings_nextn_ith(main, i);
        if (row == nullptr) {
            throw std::runtime_error("the main context gave no nextn hidden state for row " + std::to_string(i));
        }
        std::memcpy(&h[(size_t) (i + 1) * (size_t) width_], row, sizeof(float) * (size_t) width_);
    }
    const float * last = llama_get_embeddings_nextn_ith(main, valid - 1);
    if (last == nullptr) {
        throw std::runtime_error("the main context gave no nextn hidden state for its last accepted row");
    }
    if (decode_rows(tokens.data(), h.data(), p, valid) != 0) {
        throw std::runtime_error("the MTP context could not take positions " + std::to_string(p) + ".." +
                                 std::to_string(p + valid - 1));
    }
    std::memcpy(pending_h_.data(), last, sizeof(float) * (size_t) width_);
    caught_h_ = std::move(h);
    caught_p_ = p;
}

std::vector<int32_t> MtpDrafter::draft(int32_t bonus, int32_t position, int32_t k) {
    std::vector<int32_t> out;
    std::vector<float> h = pending_h_;
    int32_t token = bonus;
    for (int32_t j = 0; j < k; ++j) {
        if (decode_rows(&token, h.data(), position + j, 1) != 0) {
            break;  // no room left (context full): fewer drafts, never a failed pass
        }
        token = greedy_token(llama_get_logits_ith(ctx_, 0), n_vocab_);
        out.push_back(token);
        const float * next = llama_get_embeddings_nextn_ith(ctx_, 0);
        if (next == nullptr) {
            break;
        }
        std::memcpy(h.data(), next, sizeof(float) * (size_t) width_);
    }
    rewind(position);  // the drafts are not the session's: the next pass verifies them
    return out;
}

int32_t accepted_drafts(llama_context * main, const std::vector<int32_t> & tokens, int32_t drafted, int32_t n_vocab) {
    const int32_t n = (int32_t) tokens.size();
    int32_t kept = 0;
    while (kept < drafted) {
        const int32_t at = n - drafted + kept;  // the draft; the row before it chose its position's token
        if (greedy_token(llama_get_logits_ith(main, at - 1), n_vocab) != tokens[at]) {
            break;
        }
        ++kept;
    }
    return kept;
}

}  // namespace dgr
