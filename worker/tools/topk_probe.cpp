// dgr-topk-probe: how well conditioned a model's top-k selections are on given prompts.
//
// Runs each prompt the way the certifier's driver does (prefill in one batch, then greedy decode one
// token at a time until --n-decode tokens are chosen, fresh KV per prompt) on the CPU, and watches
// every selection the graph makes: GGML_OP_TOP_K nodes (DeepSeek V4's lightning indexer,
// "lid_score_masked-<il>" -> ggml_top_k) and the MoE router's GGML_OP_ARGSORT
// ("ffn_moe_argsort-<il>", of which llama-graph.cpp keeps the first expert_used_count). A selection
// is contested when more finite candidates than k compete; on those rows the gap between the k-th
// and (k+1)-th largest value says how close a different backend's rounding or tie rule is to
// picking a different set. An exact tie (gap 0) is decided by the kernel's tie rule alone.
//
//   dgr-topk-probe --model FILE --threads N --n-decode N --prompts-file FILE [--ctx N] [--out FILE]
//
// The prompts file is a JSON list; each item is a list of token ids or a string, which is tokenized
// with the model's vocab as the worker's Tokenize does (special tokens added, none parsed).
// Output: one JSON document (schema_version 1, kind "dgr.topk_probe") on stdout, or in --out FILE;
// llama.cpp's log goes to stderr (errors only).
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"
#include "tensor_rows.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

using json = nlohmann::ordered_json;

namespace {

// A contested row whose relative margin is below this counts as a near tie (reported per op).
constexpr double NEAR_TIE_REL = 1e-3;

struct Options {
    std::string model;
    std::string prompts_file;
    std::string out;  // "" = stdout
    int threads = 1;
    int n_decode = 1;
    int n_ctx = 256;  // what the certifier gives tiny recipes (certify.run.ctx_size)
};

// Where a row was seen: prompt index and token position.
struct Where {
    int sequence = -1;
    int position = -1;
};

// The selection boundary of one row.
struct Boundary {
    int64_t n_finite = 0;
    bool contested = false;
    double kth = 0.0;   // k-th largest
    double next = 0.0;  // (k+1)-th largest
};

// Everything seen at one selection op (aggregated over rows, passes and prompts).
struct Selection {
    std::string input;  // name of the tensor the op selects from
    std::string node;   // name of the op itself ("" when the graph does not name it)
    std::string op;
    std::string kind;
    int layer = -1;
    int64_t k = 0;
    int64_t rows = 0, contested = 0, exact_ties = 0, near_ties = 0;
    double min_abs = std::numeric_limits<double>::infinity();
    double min_rel = std::numeric_limits<double>::infinity();
    Where min_abs_at, min_rel_at;
};

struct Probe {
    int64_t router_k = 0;  // the model's expert_used_count (0: no MoE router)
    Where batch;           // prompt index and position of the current batch's first token
    std::map<std::string, Selection> selections;
    std::vector<char> staging;
};

[[noreturn]] void usage(const std::string & why) {
    std::fprintf(stderr,
                 "dgr-topk-probe: %s\nusage: dgr-topk-probe --model FILE --threads N --n-decode N "
                 "--prompts-file FILE [--ctx N] [--out FILE]\n",
                 why.c_str());
    std::exit(2);
}

int parse_positive(const std::string & arg, const std::string & val) {
    char * end = nullptr;
    const long v = std::strtol(val.c_str(), &end, 10);
    if (end == val.c_str() || *end != '\0' || v < 1 || v > (1 << 24)) {
        usage(arg + ": expected a positive integer, got '" + val + "'");
    }
    return (int) v;
}

Options parse_options(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; i += 2) {
        const std::string arg = argv[i];
        if (i + 1 >= argc) {
            usage("missing value after " + arg);
        }
        const std::string val = argv[i + 1];
        if (arg == "--model") {
            o.model = val;
        } else if (arg == "--prompts-file") {
            o.prompts_file = val;
        } else if (arg == "--threads") {
            o.threads = parse_positive(arg, val);
        } else if (arg == "--n-decode") {
            o.n_decode = parse_positive(arg, val);
        } else if (arg == "--ctx") {
            o.n_ctx = parse_positive(arg, val);
        } else if (arg == "--out") {
            o.out = val;
        } else {
            usage("unknown argument '" + arg + "'");
        }
    }
    if (o.model.empty() || o.prompts_file.empty()) {
        usage("--model and --prompts-file are required");
    }
    return o;
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text) {
    std::vector<llama_token> out(text.size() + 8);
    int32_t n =
        llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), true, false);
    if (n < 0) {
        out.resize((size_t) -n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), true, false);
    }
    if (n < 0) {
        throw std::runtime_error("could not tokenize '" + text + "'");
    }
    out.resize((size_t) n);
    return out;
}

std::vector<std::vector<llama_token>> load_prompts(const std::string & path, const llama_vocab * vocab) {
    std::ifstream in(path);
    if (!in) {
        throw std::runtime_error("cannot read " + path);
    }
    const json doc = json::parse(in);
    if (!doc.is_array() || doc.empty()) {
        throw std::runtime_error(path + ": expected a non-empty JSON list of prompts");
    }
    std::vector<std::vector<llama_token>> prompts;
    for (const auto & item : doc) {
        prompts.push_back(item.is_string() ? tokenize(vocab, item.get<std::string>())
                                           : item.get<std::vector<llama_token>>());
        if (prompts.back().empty()) {
            throw std::runtime_error(path + ": a prompt has no tokens");
        }
    }
    return prompts;
}

int64_t model_router_k(const llama_model * model) {
    char arch[64] = {0}, value[64] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch)) < 0) {
        return 0;
    }
    const std::string key = std::string(arch) + ".expert_used_count";
    return llama_model_meta_val_str(model, key.c_str(), value, sizeof(value)) < 0 ? 0 : std::atoll(value);
}

bool starts_with(const char * s, const char * prefix) {
    return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

// How many candidates the op keeps per row; 0 for nodes that select nothing we know of.
int64_t selection_k(const ggml_tensor * t, const Probe & p) {
    if (t->op == GGML_OP_TOP_K) {
        return t->ne[0];
    }
    if (t->op == GGML_OP_ARGSORT && starts_with(t->name, "ffn_moe_argsort") && p.router_k > 0) {
        return std::min<int64_t>(p.router_k, t->ne[0]);  // llama-graph.cpp views the first n_expert_used
    }
    return 0;
}

int layer_of(const std::string & name) {
    const size_t dash = name.rfind('-');
    if (dash == std::string::npos || dash + 1 == name.size() ||
        name.find_first_not_of("0123456789", dash + 1) != std::string::npos) {
        return -1;
    }
    return std::atoi(name.c_str() + dash + 1);
}

Selection describe(const ggml_tensor * t, int64_t k) {
    Selection s;
    s.input = t->src[0]->name;
    s.node = t->name;
    s.op = ggml_op_name(t->op);
    s.kind = starts_with(t->src[0]->name, "lid_") ? "indexer" : t->op == GGML_OP_ARGSORT ? "router" : "other";
    s.layer = layer_of(s.input) >= 0 ? layer_of(s.input) : layer_of(s.node);
    s.k = k;
    return s;
}

Boundary boundary(const std::vector<float> & row, int64_t k) {
    std::vector<float> finite;
    for (float v : row) {
        if (std::isfinite(v)) {
            finite.push_back(v);
        }
    }
    Boundary b;
    b.n_finite = (int64_t) finite.size();
    b.contested = b.n_finite > k;
    if (b.contested) {
        std::partial_sort(finite.begin(), finite.begin() + k + 1, finite.end(), std::greater<float>());
        b.kth = finite[(size_t) k - 1];
        b.next = finite[(size_t) k];
    }
    return b;
}

void tally(Selection & s, const Boundary & b, const Where & at) {
    s.rows += 1;
    if (!b.contested) {
        return;
    }
    s.contested += 1;
    s.exact_ties += b.kth == b.next ? 1 : 0;
    const double margin = b.kth - b.next;
    const double rel = margin / std::max(std::fabs(b.kth), (double) std::numeric_limits<float>::min());
    s.near_ties += rel < NEAR_TIE_REL ? 1 : 0;
    if (margin < s.min_abs) {
        s.min_abs = margin;
        s.min_abs_at = at;
    }
    if (rel < s.min_rel) {
        s.min_rel = rel;
        s.min_rel_at = at;
    }
}

// Rows of a selection input are [candidates, tokens of the batch, ...]: row i1 is the batch's token i1.
void observe(const ggml_tensor * t, Probe & p) {
    const int64_t k = selection_k(t, p);
    const std::string key = std::string(ggml_op_name(t->op)) + ":" + t->src[0]->name;
    auto it = p.selections.find(key);
    if (it == p.selections.end()) {
        it = p.selections.emplace(key, describe(t, k)).first;
    }
    const auto rows = dgr::read_rows(t->src[0], p.staging);
    for (size_t r = 0; r < rows.size(); ++r) {
        const Where at{p.batch.sequence, p.batch.position + (int) (r % (size_t) t->src[0]->ne[1])};
        tally(it->second, boundary(rows[r], k), at);
    }
}

// ggml_backend_sched's protocol: asked first (ask=true) whether we want a node; then, once it is
// computed, shown it (ask=false). Returning false there would stop the graph.
bool on_node(ggml_tensor * t, bool ask, void * user) {
    auto & p = *static_cast<Probe *>(user);
    if (ask) {
        return p.batch.sequence >= 0 && selection_k(t, p) > 0;  // not during a graph reserve
    }
    observe(t, p);
    return true;
}

llama_token argmax_last(llama_context * ctx, int32_t n_vocab) {
    const float * logits = llama_get_logits_ith(ctx, -1);
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);  // first maximum, as numpy
}

void decode(llama_context * ctx, std::vector<llama_token> & tokens) {
    if (llama_decode(ctx, llama_batch_get_one(tokens.data(), (int32_t) tokens.size())) != 0) {
        throw std::runtime_error("llama_decode failed");
    }
}

// The driver's greedy pass: prefill the prompt at 0.., then decode until n_decode tokens are chosen.
void run_sequence(llama_context * ctx, const llama_vocab * vocab, std::vector<llama_token> prompt, int n_decode,
                  int index, Probe & p) {
    llama_memory_clear(llama_get_memory(ctx), true);
    p.batch = {index, 0};
    decode(ctx, prompt);
    std::vector<llama_token> next{argmax_last(ctx, llama_vocab_n_tokens(vocab))};
    for (int chosen = 1; chosen < n_decode; ++chosen) {
        p.batch = {index, (int) prompt.size() + chosen - 1};
        decode(ctx, next);
        next[0] = argmax_last(ctx, llama_vocab_n_tokens(vocab));
    }
}

json where_json(const Where & w) {
    return w.sequence < 0 ? json(nullptr) : json{{"sequence", w.sequence}, {"position", w.position}};
}

json number_or_null(double v) {
    return std::isfinite(v) ? json(v) : json(nullptr);
}

json report(const Options & o, size_t n_prompts, const Probe & p) {
    json selections = json::array();
    for (const auto & [key, s] : p.selections) {
        selections.push_back({
            {"input", s.input},
            {"node", s.node},
            {"op", s.op},
            {"kind", s.kind},
            {"layer", s.layer < 0 ? json(nullptr) : json(s.layer)},
            {"k", s.k},
            {"rows", s.rows},
            {"contested_rows", s.contested},
            {"exact_ties", s.exact_ties},
            {"near_ties", s.near_ties},
            {"min_abs_margin", number_or_null(s.min_abs)},
            {"min_abs_margin_at", where_json(s.min_abs_at)},
            {"min_rel_margin", number_or_null(s.min_rel)},
            {"min_rel_margin_at", where_json(s.min_rel_at)},
        });
    }
    std::sort(selections.begin(), selections.end(), [](const json & a, const json & b) {
        return std::make_tuple(a["layer"].is_null() ? -1 : a["layer"].get<int>(), a["kind"].get<std::string>()) <
               std::make_tuple(b["layer"].is_null() ? -1 : b["layer"].get<int>(), b["kind"].get<std::string>());
    });
    return {
        {"schema_version", 1},      {"kind", "dgr.topk_probe"}, {"model", o.model},
        {"threads", o.threads},     {"n_ctx", o.n_ctx},         {"n_decode", o.n_decode},
        {"prompts", n_prompts},     {"router_k", p.router_k},   {"near_tie_rel", NEAR_TIE_REL},
        {"selections", selections},
    };
}

void write_report(const Options & o, const json & doc) {
    if (o.out.empty()) {
        std::printf("%s\n", doc.dump(2).c_str());
        return;
    }
    std::ofstream out(o.out);
    out << doc.dump(2) << "\n";
    if (!out) {
        throw std::runtime_error("cannot write " + o.out);
    }
}

void log_errors_only(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

llama_context * cpu_context(llama_model * model, const Options & o, Probe & p) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) o.n_ctx;
    cp.n_batch = (uint32_t) o.n_ctx;  // one prefill batch, one ubatch, as the worker
    cp.n_ubatch = (uint32_t) o.n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = o.threads;
    cp.n_threads_batch = o.threads;
    cp.no_perf = true;
    cp.op_offload = false;
    cp.cb_eval = on_node;
    cp.cb_eval_user_data = &p;
    return llama_init_from_model(model, cp);
}

}  // namespace

int main(int argc, char ** argv) {
    const Options o = parse_options(argc, argv);
    llama_log_set(log_errors_only, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    ggml_backend_dev_t no_devices[] = {nullptr};  // the CPU only: no device is offloaded to
    mp.devices = no_devices;
    llama_model * model = llama_model_load_from_file(o.model.c_str(), mp);
    if (model == nullptr) {
        std::fprintf(stderr, "dgr-topk-probe: cannot load %s\n", o.model.c_str());
        return 6;
    }
    int rc = 0;
    Probe p;
    p.router_k = model_router_k(model);
    llama_context * ctx = cpu_context(model, o, p);
    try {
        if (ctx == nullptr) {
            throw std::runtime_error("cannot create a context");
        }
        const llama_vocab * vocab = llama_model_get_vocab(model);
        const auto prompts = load_prompts(o.prompts_file, vocab);
        for (size_t i = 0; i < prompts.size(); ++i) {
            if ((int) prompts[i].size() + o.n_decode > o.n_ctx) {
                throw std::runtime_error("prompt " + std::to_string(i) + " plus --n-decode exceeds --ctx");
            }
            run_sequence(ctx, vocab, prompts[i], o.n_decode, (int) i, p);
        }
        write_report(o, report(o, prompts.size(), p));
    } catch (const std::exception & e) {
        std::fprintf(stderr, "dgr-topk-probe: %s\n", e.what());
        rc = 6;
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
