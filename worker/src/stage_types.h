// The plain data a stage takes and gives: a Forward's arguments as the stage reads them, its result,
// and the stage's fixed facts. Its own header, free of llama and ggml, so that the request checks
// (request_checks.h) and the wire readers (request_args.h) build alone: the fuzz targets in
// worker/fuzz link them without a model or a backend.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
    std::string load_mode;                          // llama's name of the mode the weights were loaded with (weights.h)
    std::map<int32_t, uint64_t> kv_bytes_by_layer;  // the memory the stage's graph reads (memory_layers.h)
    int64_t kv_unread_bytes = 0;                    // memory allocated that no node of its graph reads
};

struct SessionFigures {  // what one session holds now (Stage::session_figures)
    uint64_t epoch = 0;
    int32_t n_past = 0;
    uint64_t state_bytes = 0;  // llama_state_seq_get_size: the bytes saving its state would write
};

struct StageInfo {
    std::string architecture;
    bool names_layer_outputs = false;  // its graph names "l_out-<il>" (memory_layers.h): captures after layer 0
    std::string backend_devices;
    int32_t n_layer = 0, layer_begin = 0, layer_end = 0;
    bool first_stage = false, last_stage = false;
    int32_t n_embd = 0, boundary_width = 0, n_vocab = 0;
    int32_t n_ctx = 0, n_batch = 0, n_threads = 0, max_rewind = 0;
    std::string cpus;  // --cpus as given; "": free to run anywhere
    bool needs_token_sideband = false;
    int32_t positions_per_row = 1;  // M-RoPE: llama reads this many positions for each embedding row
    bool mtp = false;               // the last stage drafts with the nextn block
    MemoryFigures memory;
};

}  // namespace dgr
