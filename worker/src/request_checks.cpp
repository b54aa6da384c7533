// The checks a Forward's arguments pass before a stage changes anything (stage.h), as free functions of
// the stage's fixed facts: what arrives from the network (a gRPC Forward or a pass on the pass port)
// is untrusted, and these are what stand between it and llama. The fuzz targets in worker/fuzz run
// them on every input they make.
#include "request_checks.h"

namespace dgr {

using Kind = StageError::Kind;

size_t dtype_size(DType t) {
    return t == DType::F16 ? sizeof(uint16_t) : sizeof(float);  // F16: ggml_fp16_t, an IEEE half in 16 bits
}

// 0002's stage cut records each layer's input as the previous layer's named output ("l_out"), so a layer
// after the first can be captured wherever the graph names its outputs; the first layer's input (the
// embedding as the builder made it) only where the builder records it. Anywhere else llama-graph would
// abort the process on the capture.
bool records_every_layer_input(const std::string & arch) {
    return arch == "llama" || arch == "deepseek4";
}

const char * const RECORDING_ARCHITECTURES = "llama, deepseek4";

static bool capturable(const StageInfo & in, int32_t layer) {
    return records_every_layer_input(in.architecture) || (layer > 0 && in.names_layer_outputs);
}

// Every id in the stage's vocabulary; ``what`` names them in the refusal.
static void check_vocabulary(const StageInfo & in, const std::vector<int32_t> & tokens, const char * what) {
    for (int32_t t : tokens) {
        if (t < 0 || t >= in.n_vocab) {
            throw StageError(Kind::InvalidArgument, std::string(what) + " " + std::to_string(t) +
                                                        " outside the vocabulary [0, " + std::to_string(in.n_vocab) +
                                                        ")");
        }
    }
}

void check_request(const StageInfo & in, const ForwardArgs & a, int32_t n_tokens) {
    if (a.session_id.empty()) {
        throw StageError(Kind::InvalidArgument, "session_id is empty");
    }
    if (n_tokens <= 0) {
        throw StageError(Kind::InvalidArgument, "positions is empty: nothing to compute");
    }
    if (n_tokens > in.n_batch) {
        throw StageError(Kind::InvalidArgument, std::to_string(n_tokens) +
                                                    " positions in one Forward; this worker takes at most " +
                                                    std::to_string(in.n_batch) + " (split the prefill)");
    }
    if (in.first_stage) {
        if ((int32_t) a.tokens.size() != n_tokens) {
            throw StageError(Kind::InvalidArgument, "first stage: expected " + std::to_string(n_tokens) +
                                                        " token ids (one per position), got " +
                                                        std::to_string(a.tokens.size()));
        }
        if (a.has_boundary) {
            throw StageError(Kind::InvalidArgument, "first stage (layers 0:" + std::to_string(in.layer_end) +
                                                        ") takes token ids, not a boundary tensor");
        }
        check_vocabulary(in, a.tokens, "token id");
    } else {
        if (!a.has_boundary) {
            throw StageError(Kind::InvalidArgument, "stage starting at layer " + std::to_string(in.layer_begin) +
                                                        " needs the boundary tensor [n_tokens, " +
                                                        std::to_string(in.boundary_width) + "]");
        }
        const auto & b = a.boundary;
        if (b.shape.size() != 2 || b.shape[0] != n_tokens || b.shape[1] != in.boundary_width) {
            std::string got;
            for (size_t i = 0; i < b.shape.size(); ++i) {
                got += (i ? ", " : "") + std::to_string(b.shape[i]);
            }
            throw StageError(Kind::InvalidArgument, "boundary shape [" + got + "] does not fit this stage: expected [" +
                                                        std::to_string(n_tokens) + ", " +
                                                        std::to_string(in.boundary_width) + "]");
        }
        const size_t want = (size_t) n_tokens * (size_t) in.boundary_width * dtype_size(b.dtype);
        if (b.data == nullptr || b.data->size() != want) {
            throw StageError(Kind::InvalidArgument, "boundary data is " + std::to_string(b.data ? b.data->size() : 0) +
                                                        " bytes, expected " + std::to_string(want) +
                                                        " for its shape and dtype");
        }
        if (!a.tokens.empty() && (int32_t) a.tokens.size() != n_tokens) {
            throw StageError(Kind::InvalidArgument, "token sideband has " + std::to_string(a.tokens.size()) +
                                                        " ids for " + std::to_string(n_tokens) + " positions");
        }
        if (in.needs_token_sideband && a.tokens.empty()) {
            throw StageError(Kind::InvalidArgument,
                             "stage starting at layer " + std::to_string(in.layer_begin) +
                                 " owns hash-routed layers: send the token ids (one per position) with the boundary");
        }
        check_vocabulary(in, a.tokens, "sideband token id");
    }
    for (int32_t l : a.capture_layers) {
        if (!capturable(in, l)) {
            throw StageError(Kind::FailedPrecondition,
                             "capture of layer " + std::to_string(l) + " is not supported for architecture " +
                                 in.architecture + ": its graph records no input for it (" +
                                 (l == 0 ? std::string("the first layer's, only ") + RECORDING_ARCHITECTURES
                                         : std::string("it names no layer output")) +
                                 ")");
        }
        if (l < in.layer_begin || l >= in.layer_end) {
            throw StageError(Kind::InvalidArgument,
                             "capture layer " + std::to_string(l) + " is not owned by this stage [" +
                                 std::to_string(in.layer_begin) + ", " + std::to_string(in.layer_end) + ")");
        }
    }
}

// A rewind takes back at most max_rewind positions (what rolling state keeps snapshots for).
void check_positions(const ForwardArgs & a, int32_t n_tokens) {
    const int32_t p0 = a.positions.front();
    for (int32_t i = 1; i < n_tokens; ++i) {
        if (a.positions[i] != p0 + i) {
            throw StageError(Kind::FailedPrecondition, "positions are not contiguous at index " + std::to_string(i));
        }
    }
}

void check_rewind(const StageInfo & in, const ForwardArgs & a, int32_t n_past) {
    const int32_t p0 = a.positions.front();
    const int32_t depth = n_past - p0;
    if (in.max_rewind == 0) {
        throw StageError(Kind::FailedPrecondition, "rewind of " + std::to_string(depth) +
                                                       " positions asked, but this worker "
                                                       "keeps no rollback state (start it with --max-rewind N)");
    }
    if (depth > in.max_rewind) {
        throw StageError(Kind::FailedPrecondition,
                         "rewind of session '" + a.session_id + "' from " + std::to_string(n_past) + " to " +
                             std::to_string(p0) + " takes back " + std::to_string(depth) + " positions; this worker " +
                             "takes back at most " + std::to_string(in.max_rewind));
    }
}

void check_draft(const StageInfo & in, const ForwardArgs & a, int32_t n_tokens) {
    if (!in.last_stage) {
        return;  // a chained pass carries draft/drafted through the stages to the last one
    }
    if ((a.draft > 0 || a.drafted > 0) && !in.mtp) {
        throw StageError(Kind::FailedPrecondition, "this stage drafts nothing: only the last stage of workers started "
                                                   "with --mtp verifies and drafts");
    }
    if (!in.mtp) {
        return;
    }
    if ((int32_t) a.tokens.size() != n_tokens) {
        throw StageError(Kind::InvalidArgument,
                         "the MTP last stage needs the pass's token ids (one per position): got " +
                             std::to_string(a.tokens.size()) + " for " + std::to_string(n_tokens) + " positions");
    }
    if (a.drafted >= n_tokens) {
        throw StageError(Kind::InvalidArgument, std::to_string(a.drafted) + " drafted tokens in a pass of " +
                                                    std::to_string(n_tokens) +
                                                    ": the first token of a pass is never a draft");
    }
    if (a.draft > in.max_rewind) {
        throw StageError(Kind::InvalidArgument, "draft of " + std::to_string(a.draft) + " tokens: a pass can reject " +
                                                    "them all, and this worker takes back at most " +
                                                    std::to_string(in.max_rewind) + " (start it with --max-rewind " +
                                                    std::to_string(a.draft) + ")");
    }
}

}  // namespace dgr
