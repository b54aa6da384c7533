// The nextn (MTP) block on the last stage of a pipeline: a DeepSeek-V4 model with one nextn block
// (tiny-v4-mtp) loaded as two stages, [0, cut) without MTP and [cut, n_layer) with load_mtp, and the
// last stage's LLAMA_CONTEXT_TYPE_MTP context, against the whole model with load_mtp in one process.
//
//   mtp-last-stage -m MODEL -c CUT -n N_DECODE -t THREADS -p "PROMPT"
//
// Greedy decoding of N_DECODE tokens after the prompt. After each main pass the MTP context takes the
// positions that pass produced, as common/speculative.cpp's draft-mtp does: its input at position p is
// the main model's hidden state at p - 1 (llama_get_embeddings_nextn, n_embd x hc wide; zeros at
// position 0) with the token at p, and the row of the newest token yields the draft for the position
// after it. Checked bitwise, on the same backend and thread count: the staged main logits and hidden
// states equal the whole model's, the staged MTP logits (so the drafts) equal the whole model's MTP
// logits, and loading the nextn block leaves the main logits unchanged (whole model with load_mtp off).
// Prints the figures one per line ("key: value") and "OK", or a failed check and exit 1.

#include "llama.h"
#include "llama-ext.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static int g_threads = 2;

static llama_model * load(const char * path, int32_t begin, int32_t end, bool mtp) {
    llama_model_params mp = llama_model_default_params();
    mp.layer_begin = begin;
    mp.layer_end   = end;
    mp.load_mtp    = mtp;
    llama_model * m = llama_model_load_from_file(path, mp);
    CHECK(m != nullptr);
    return m;
}

static llama_context * context(llama_model * model, bool mtp, bool boundary_out = false) {
    llama_context_params cp = llama_context_default_params();
    cp.embeddings      = boundary_out;  // a stage before the last outputs its residual as its embeddings
    cp.pooling_type    = LLAMA_POOLING_TYPE_NONE;
    cp.n_ctx           = 256;
    cp.n_batch         = 256;
    cp.n_ubatch        = 256;
    cp.n_seq_max       = 1;
    cp.n_threads       = g_threads;
    cp.n_threads_batch = g_threads;
    if (mtp) {
        cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    CHECK(ctx != nullptr);
    return ctx;
}

// one batch at positions [pos0, pos0 + n): tokens, and for a later stage or an MTP context the rows
// in embd (width floats each); logits for every row, or only the last
static void decode(llama_context * ctx, const llama_token * tokens, int32_t n, int32_t pos0,
                   const float * embd, int32_t width, bool all_logits) {
    llama_batch batch = llama_batch_init(n, embd ? width : 0, 1);
    if (embd) {
        batch.token = (llama_token *) malloc(sizeof(llama_token) * (size_t) n);  // both, as draft-mtp does
        memcpy(batch.embd, embd, sizeof(float) * (size_t) n * (size_t) width);
    }
    batch.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        batch.token[i]     = tokens[i];
        batch.pos[i]       = pos0 + i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = all_logits || i == n - 1;
    }
    const int rc = llama_decode(ctx, batch);
    if (embd) {
        free(batch.token);
        batch.token = nullptr;
    }
    llama_batch_free(batch);
    CHECK(rc == 0);
}

static bool same(const float * a, const float * b, size_t n, double * max_diff) {
    for (size_t i = 0; i < n; ++i) {
        *max_diff = fmax(*max_diff, fabs((double) a[i] - (double) b[i]));
    }
    return memcmp(a, b, sizeof(float) * n) == 0;
}

static llama_token argmax(const float * logits, int32_t n_vocab) {
    int32_t best = 0;
    for (int32_t v = 1; v < n_vocab; ++v) {
        if (logits[v] > logits[best]) {  // the first of equal maxima, numpy's rule
            best = v;
        }
    }
    return best;
}

int main(int argc, char ** argv) {
    const char * path   = nullptr;
    int32_t      cut    = 0;
    int32_t      n_dec  = 8;
    std::string  prompt = "The quick brown fox jumps over the lazy dog.";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "-m") { path = argv[i + 1]; }
        else if (a == "-c") { cut = atoi(argv[i + 1]); }
        else if (a == "-n") { n_dec = atoi(argv[i + 1]); }
        else if (a == "-t") { g_threads = atoi(argv[i + 1]); }
        else if (a == "-p") { prompt = argv[i + 1]; }
        else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 1; }
    }
    if (!path || cut <= 0 || n_dec < 1) {
        fprintf(stderr, "usage: %s -m MODEL -c CUT [-n N_DECODE] [-t THREADS] [-p PROMPT]\n", argv[0]);
        return 1;
    }
    llama_backend_init();

    llama_model * whole     = load(path, 0, -1, true);
    llama_model * whole_off = load(path, 0, -1, false);
    llama_model * first     = load(path, 0, cut, false);
    llama_model * last      = load(path, cut, -1, true);
    llama_model * last_off  = load(path, cut, -1, false);

    const int32_t n_layer = llama_model_n_layer(whole);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(whole));
    const int32_t width   = llama_model_n_embd_out(first);
    const int32_t h_width = llama_model_n_embd_out(last);
    CHECK(cut < n_layer);
    printf("n_layer: %d\nn_layer_nextn whole: %d\nn_layer_nextn last: %d\n", n_layer,
           llama_model_n_layer_nextn(whole), llama_model_n_layer_nextn(last));
    printf("last stage bytes with mtp: %llu\nlast stage bytes without mtp: %llu\n",
           (unsigned long long) llama_model_size(last), (unsigned long long) llama_model_size(last_off));
    printf("first stage bytes: %llu\nwhole bytes without mtp: %llu\n", (unsigned long long) llama_model_size(first),
           (unsigned long long) llama_model_size(whole_off));
    printf("boundary width: %d\nnextn hidden width: %d\n", width, h_width);
    CHECK(llama_model_n_layer_nextn(last) == 1);
    CHECK(h_width == width);

    llama_context * ctx_whole     = context(whole, false);
    llama_context * ctx_whole_off = context(whole_off, false);
    llama_context * ctx_first     = context(first, false, true);
    llama_context * ctx_last      = context(last, false);
    llama_context * mtp_whole     = context(whole, true);
    llama_context * mtp_last      = context(last, true);
    llama_set_embeddings_nextn(ctx_whole, true, /*masked*/ false);
    llama_set_embeddings_nextn(ctx_last, true, /*masked*/ false);
    llama_set_embeddings_nextn(mtp_whole, true, /*masked*/ true);
    llama_set_embeddings_nextn(mtp_last, true, /*masked*/ true);

    std::vector<llama_token> toks(prompt.size() + 8);
    const int32_t n_prompt = llama_tokenize(llama_model_get_vocab(whole), prompt.c_str(), (int32_t) prompt.size(),
                                            toks.data(), (int32_t) toks.size(), true, false);
    CHECK(n_prompt > 1);
    toks.resize(n_prompt);

    std::vector<float> h_prev(h_width, 0.0f);  // the main hidden state of the position before a batch's first
    double max_main = 0.0, max_h = 0.0, max_mtp = 0.0, max_off = 0.0;
    int32_t n_draft = 0, n_hit = 0;
    llama_token draft = -1;
    std::string drafts_made;  // every draft, in order: what a worker's last stage must draft from the same state
    int32_t pos = 0;
    std::vector<llama_token> batch_toks(toks);
    for (int32_t step = 0; step <= n_dec; ++step) {
        const int32_t n = (int32_t) batch_toks.size();
        decode(ctx_whole, batch_toks.data(), n, pos, nullptr, 0, true);
        decode(ctx_whole_off, batch_toks.data(), n, pos, nullptr, 0, true);
        decode(ctx_first, batch_toks.data(), n, pos, nullptr, 0, true);
        const float * boundary = llama_get_embeddings(ctx_first);
        CHECK(boundary != nullptr);
        const std::vector<float> rows(boundary, boundary + (size_t) n * (size_t) width);
        decode(ctx_last, batch_toks.data(), n, pos, rows.data(), width, true);
        for (int32_t i = 0; i < n; ++i) {
            CHECK(same(llama_get_logits_ith(ctx_whole, i), llama_get_logits_ith(ctx_last, i), n_vocab, &max_main));
            CHECK(same(llama_get_logits_ith(ctx_whole, i), llama_get_logits_ith(ctx_whole_off, i), n_vocab, &max_off));
        }
        const float * h_whole = llama_get_embeddings_nextn(ctx_whole);
        const float * h_last  = llama_get_embeddings_nextn(ctx_last);
        CHECK(h_whole != nullptr && h_last != nullptr);
        CHECK(same(h_whole, h_last, (size_t) n * (size_t) h_width, &max_h));

        const llama_token chosen = argmax(llama_get_logits_ith(ctx_last, n - 1), n_vocab);
        if (draft >= 0) {
            n_draft++;
            n_hit += draft == chosen;
        }
        if (step == n_dec) {
            break;
        }
        // the MTP context catches up on this pass's positions + 1: (h[p-1], token[p]) for the batch's
        // tokens after the first, then the chosen token with the newest hidden state (its logits: the draft)
        std::vector<llama_token> mtp_toks(batch_toks.begin(), batch_toks.end());
        mtp_toks.push_back(chosen);
        std::vector<float> mtp_h((size_t) (n + 1) * (size_t) h_width);
        memcpy(mtp_h.data(), h_prev.data(), sizeof(float) * (size_t) h_width);
        memcpy(mtp_h.data() + h_width, h_last, sizeof(float) * (size_t) n * (size_t) h_width);
        // the batch's first row pairs with the previous pass's last hidden state; the MTP context
        // already holds that position from the previous step, so start one later
        const int32_t skip = pos == 0 ? 0 : 1;
        decode(mtp_whole, mtp_toks.data() + skip, n + 1 - skip, pos + skip, mtp_h.data() + (size_t) skip * h_width,
               h_width, false);
        decode(mtp_last, mtp_toks.data() + skip, n + 1 - skip, pos + skip, mtp_h.data() + (size_t) skip * h_width,
               h_width, false);
        const float * d_whole = llama_get_logits_ith(mtp_whole, -1);
        const float * d_last  = llama_get_logits_ith(mtp_last, -1);
        CHECK(d_whole != nullptr && d_last != nullptr);
        CHECK(same(d_whole, d_last, n_vocab, &max_mtp));
        for (int32_t v = 0; v < n_vocab; ++v) {
            CHECK(std::isfinite(d_last[v]));
        }
        draft = argmax(d_last, n_vocab);
        drafts_made += (drafts_made.empty() ? "" : " ") + std::to_string(draft);
        memcpy(h_prev.data(), h_last + (size_t) (n - 1) * h_width, sizeof(float) * (size_t) h_width);
        pos += n;
        batch_toks.assign(1, chosen);
    }
    printf("prompt tokens: %d\ndecoded: %d\ndrafts: %d\ndrafts accepted: %d\n", n_prompt, n_dec, n_draft, n_hit);
    printf("draft tokens: %s\n", drafts_made.c_str());
    printf("max |main logits staged - whole|: %g\nmax |h_nextn staged - whole|: %g\n", max_main, max_h);
    printf("max |mtp logits staged - whole|: %g\nmax |main logits mtp on - off|: %g\n", max_mtp, max_off);

    llama_free(mtp_last);
    llama_free(mtp_whole);
    llama_free(ctx_last);
    llama_free(ctx_first);
    llama_free(ctx_whole_off);
    llama_free(ctx_whole);
    llama_model_free(last_off);
    llama_model_free(last);
    llama_model_free(first);
    llama_model_free(whole_off);
    llama_model_free(whole);
    llama_backend_free();
    printf("OK\n");
    return 0;
}
