#include "fuzz_stages.h"

#include "request_args.h"
#include "request_checks.h"

#include <cstring>
#include <vector>

namespace dgr::fuzz {

// The four places a stage can hold in a placement (first, middle, middle owning hash-routed layers, last
// drafting with MTP), with the tiny model's widths (tests/fuzz/corpus/passes are its passes, so a
// mutated seed is often one a stage accepts, and what follows acceptance is fuzzed too).
static std::vector<StageInfo> stage_shapes() {
    StageInfo first;
    first.architecture = "llama";
    first.n_layer = 12, first.layer_begin = 0, first.layer_end = 4;
    first.first_stage = true, first.has_token_embd = true;
    first.n_embd = first.boundary_width = 256, first.n_vocab = 32000;
    first.n_ctx = 512, first.n_batch = 16;

    StageInfo middle = first;
    middle.layer_begin = 4, middle.layer_end = 8;
    middle.first_stage = false, middle.has_token_embd = false;

    StageInfo hashed = middle;
    hashed.architecture = "deepseek4";
    hashed.needs_token_sideband = true;

    StageInfo last = middle;
    last.layer_begin = 8, last.layer_end = 12;
    last.last_stage = true, last.has_output_head = true;
    last.mtp = true, last.max_rewind = 4;
    return {first, middle, hashed, last};
}

// The reads Stage::forward_here makes of an accepted request (stage.cpp): one per position of the
// positions and token ids, the whole boundary. Summed so that the compiler keeps them.
static uint64_t read_as_forward_does(const StageInfo & in, const ForwardArgs & a, int32_t n_tokens) {
    uint64_t sum = 0;
    for (int32_t i = 0; i < n_tokens; ++i) {
        sum += (uint64_t) a.positions[(size_t) i];
        if (in.first_stage || in.needs_token_sideband) {
            sum += (uint64_t) a.tokens[(size_t) i];
        }
    }
    if (!in.first_stage) {
        const size_t n = (size_t) n_tokens * (size_t) in.boundary_width * dtype_size(a.boundary.dtype);
        std::vector<char> rows(n);
        std::memcpy(rows.data(), a.boundary.data->data(), n);
        for (char c : rows) {
            sum += (unsigned char) c;
        }
    }
    return sum;
}

void check_on_every_stage(const dgr::shard::v1::ForwardRequest & req) {
    ForwardArgs a;
    try {
        a = read_args(req);
    } catch (const StageError &) {
        return;
    }
    const int32_t n_tokens = (int32_t) a.positions.size();  // as Stage::forward_here counts them
    static volatile uint64_t sink;
    for (const StageInfo & in : stage_shapes()) {
        try {
            check_request(in, a, n_tokens);
            check_draft(in, a, n_tokens);
            check_positions(a, n_tokens);  // the first of Stage::plan_session's; the rest read the sessions
            if (a.rewind) {
                check_rewind(in, a, a.positions.front() + 2);  // as against a session holding two more
            }
            sink = sink + read_as_forward_does(in, a, n_tokens);
        } catch (const StageError &) {
            // refused: what a stage answers such a request with
        }
    }
}

}  // namespace dgr::fuzz
