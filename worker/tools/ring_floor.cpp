// dgr-ring-floor: how fast a ring of stage processes can decode on this host with nothing of ours in
// the way, so a ring of workers can be read against it (issue 19: seams at the physical limit).
//
//   dgr-ring-floor -m MODEL --stages N [--tokens 64] [--rounds 3] [--threads 1] [--ctx 512]
//                  [--gpu-layers 0] [--deliver PORT]
//
// N processes, each holding an even contiguous layer range as a worker's stage does (the pinned tree
// with our patches, the worker's load mode and context sizes), pass {position, token, boundary} to the
// next over one loopback TCP connection each (TCP_NODELAY, as the workers' pass ports); the last picks
// the next token (the worker's greedy rule) and hands it to the first. No gRPC, no protobuf, no driver,
// no delivery unless asked (--deliver, below): what is left is llama's own work per pass, the kernel's
// socket calls and the processes taking turns. Every pass feeds one token; each round starts a fresh
// sequence at position 0.
//
// --deliver PORT: the last stage also sends each pick, {round, position, token} as three int32, to a
// listener on 127.0.0.1:PORT over one TCP connection, after it has handed the next pass on (the
// order a worker's ring keeps). With a reader there, the floor carries a driver that reads every token
// as it comes, and the cost of a raw per-token delivery can be told from the cost of ours.
//
// stdout: one JSON object: stages, threads, load_mode (the worker's choice), tok_s (per round),
// cpu_us_per_pass (per stage, CPU time over every round's passes), decode_us_per_pass (per stage, the
// wall time of llama_decode and reading its output, as a worker's compute_seconds: it splits a token's
// time into llama's own work and everything around it, on either side), tokens (the last round's picks:
// equal for every N, staging being bitwise on one backend and thread count). Exit 2 on bad usage, 1
// when a stage fails.
#include "argmax.h"
#include "gguf.h"
#include "llama.h"
#include "weights.h"

#include <arpa/inet.h>
#include <csignal>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
    std::string model;
    int stages = 1, tokens = 64, rounds = 3, threads = 1, ctx = 512, gpu_layers = 0;
    int deliver = 0;  // a loopback port the last stage sends each pick to; 0: none
};

[[noreturn]] void usage(const char * why) {
    std::fprintf(stderr,
                 "dgr-ring-floor: %s\nusage: dgr-ring-floor -m MODEL --stages N [--tokens 64] [--rounds 3] "
                 "[--threads 1] [--ctx 512] [--gpu-layers 0] [--deliver PORT]\n",
                 why);
    std::exit(2);
}

Options parse(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            usage(("missing the value of " + a).c_str());
        }
        const char * v = argv[++i];
        int * field = a == "--stages"       ? &o.stages
                      : a == "--tokens"     ? &o.tokens
                      : a == "--rounds"     ? &o.rounds
                      : a == "--threads"    ? &o.threads
                      : a == "--ctx"        ? &o.ctx
                      : a == "--gpu-layers" ? &o.gpu_layers
                      : a == "--deliver"    ? &o.deliver
                                            : nullptr;
        if (a == "-m") {
            o.model = v;
        } else if (field != nullptr) {
            char * end = nullptr;
            const long n = std::strtol(v, &end, 10);
            const long most = field == &o.deliver ? 65535 : 1000000;
            if (*end != '\0' || n < (field == &o.gpu_layers ? 0 : 1) || n > most) {
                usage((a + (field == &o.deliver ? ": not a port: " : ": not a count: ") + v).c_str());
            }
            *field = (int) n;
        } else {
            usage(("unknown option " + a).c_str());
        }
    }
    if (o.model.empty()) {
        usage("-m MODEL is required");
    }
    if (o.tokens >= o.ctx) {
        usage("--tokens must be below --ctx");
    }
    return o;
}

std::vector<pid_t> g_children;  // the parent's stage processes (empty in a stage), ended on a failure
[[noreturn]] void give_up(const std::string & why);

void send_all(int fd, const void * p, size_t n) {
    const char * c = static_cast<const char *>(p);
    while (n > 0) {
        const ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) {
            if (!g_children.empty()) {
                give_up(std::string("send: ") + std::strerror(errno));
            }
            std::_Exit(1);  // a stage: its report closes, and the parent says which
        }
        c += k;
        n -= (size_t) k;
    }
}

bool recv_all(int fd, void * p, size_t n) {
    char * c = static_cast<char *>(p);
    while (n > 0) {
        const ssize_t k = recv(fd, c, n, 0);
        if (k <= 0) {
            return false;
        }
        c += k;
        n -= (size_t) k;
    }
    return true;
}

// A connected loopback TCP pair with Nagle off: [0] writes, [1] reads.
void tcp_pair(int fds[2]) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener < 0 || bind(listener, (sockaddr *) &addr, sizeof addr) != 0 || listen(listener, 1) != 0 ||
        getsockname(listener, (sockaddr *) &addr, &len) != 0) {
        std::perror("dgr-ring-floor: loopback listener");
        std::exit(1);
    }
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    if (fds[0] < 0 || connect(fds[0], (sockaddr *) &addr, sizeof addr) != 0 ||
        (fds[1] = accept(listener, nullptr, nullptr)) < 0) {
        std::perror("dgr-ring-floor: loopback connection");
        std::exit(1);
    }
    close(listener);
    const int one = 1;
    setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// The last stage's connection to the --deliver listener (Nagle off); a stage that cannot reach it ends.
int connect_delivery(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((uint16_t) port);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (sockaddr *) &addr, sizeof addr) != 0) {
        std::fprintf(stderr, "dgr-ring-floor: --deliver %d: %s\n", port, std::strerror(errno));
        std::_Exit(1);
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (double) (u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * (double) (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A pass on the wire: position (-1: stop), token (the first stage's input), then the boundary.
struct Head {
    int32_t pos;
    int32_t token;
};

// A pick as --deliver sends it.
struct Pick {
    int32_t round, pos, token;
};

// One stage: its layers, its context, and one pass.
struct Stage {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    int width = 0, n_vocab = 0;
    bool first = false, last = false;
    double decode_seconds = 0;  // wall time inside llama_decode, every pass

    Stage(const Options & o, int begin, int end) {
        llama_model_params mp = llama_model_default_params();
        mp.layer_begin = begin;
        mp.layer_end = end;
        mp.n_gpu_layers = o.gpu_layers;
        mp.load_mode = dgr::choose_load_mode("", o.gpu_layers);  // as the worker: read onto huge pages on the CPU
        model = llama_model_load_from_file(o.model.c_str(), mp);
        if (model == nullptr) {
            std::fprintf(stderr, "dgr-ring-floor: cannot load layers %d:%d of %s\n", begin, end, o.model.c_str());
            std::exit(1);
        }
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) o.ctx;
        cp.n_batch = cp.n_ubatch = 512;  // the worker's defaults: one ubatch per pass, the same buffers
        cp.n_seq_max = 1;
        cp.n_threads = cp.n_threads_batch = o.threads;
        cp.no_perf = true;
        last = end < 0 || end == llama_model_n_layer(model);
        cp.embeddings = !last;  // a stage before the last outputs its residual as its embeddings, as a worker's
        cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
        ctx = llama_init_from_model(model, cp);
        if (ctx == nullptr) {
            std::fprintf(stderr, "dgr-ring-floor: no context for layers %d:%d\n", begin, end);
            std::exit(1);
        }
        width = llama_model_n_embd_out(model);
        n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        first = begin == 0;
    }

    // Decode one token; the last stage returns its pick, the others fill ``boundary`` for the next.
    int32_t pass(const Head & h, std::vector<float> & boundary) {
        if (h.pos == 0) {
            llama_memory_clear(llama_get_memory(ctx), true);
        }
        llama_batch b = llama_batch_init(1, first ? 0 : width, 1);
        b.n_tokens = 1;
        if (first) {
            b.token[0] = h.token;
        } else {
            std::memcpy(b.embd, boundary.data(), (size_t) width * sizeof(float));
        }
        b.pos[0] = h.pos;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = 0;
        b.logits[0] = 1;
        // timed as a worker times its compute_seconds: llama_decode and reading what it produced
        const auto decode_start = std::chrono::steady_clock::now();
        const int rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) {
            std::fprintf(stderr, "dgr-ring-floor: llama_decode failed with code %d\n", rc);
            std::_Exit(1);
        }
        int32_t pick = -1;
        if (last) {
            pick = dgr::greedy_token(llama_get_logits_ith(ctx, -1), n_vocab);
        } else {
            std::memcpy(boundary.data(), llama_get_embeddings(ctx), (size_t) width * sizeof(float));
        }
        decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - decode_start).count();
        return pick;
    }
};

// What a stage writes: the head, then its boundary unless it is the last stage (whose next pass is
// the first stage's, which reads a token).
void write_pass(int fd, const Head & h, const std::vector<float> & boundary, bool with_boundary) {
    send_all(fd, &h, sizeof h);
    if (with_boundary) {
        send_all(fd, boundary.data(), boundary.size() * sizeof(float));
    }
}

// A stage process: read a pass, compute, hand it on; the last stage turns its pick into the next pass
// and tells the parent (``report``) when a round is done. Reports its CPU per pass at the stop.
[[noreturn]] void run_stage(const Options & o, int n_layer, int index, int in, int out, int report) {
    Stage stage(o, index * n_layer / o.stages, (index + 1) * n_layer / o.stages);
    std::vector<float> boundary((size_t) stage.width);
    const int delivery = stage.last && o.deliver > 0 ? connect_delivery(o.deliver) : -1;
    int32_t round = 0;
    const int32_t ready = index;
    send_all(report, &ready, sizeof ready);
    double cpu_start = -1;
    long passes = 0;
    Head h{};
    std::vector<int32_t> picks;
    bool stopped = false;
    while (recv_all(in, &h, sizeof h) &&
           (stage.first || recv_all(in, boundary.data(), boundary.size() * sizeof(float)))) {
        if (h.pos < 0) {
            write_pass(out, h, boundary, !stage.last);  // the stop goes round once
            stopped = true;
            break;
        }
        if (cpu_start < 0) {
            cpu_start = cpu_seconds();
        }
        const int32_t pick = stage.pass(h, boundary);
        ++passes;
        if (!stage.last) {
            write_pass(out, h, boundary, true);
            continue;
        }
        picks.push_back(pick);
        const Pick got{round, h.pos, pick};
        h.token = pick;
        const bool round_done = ++h.pos == o.tokens;
        if (!round_done) {
            write_pass(out, h, boundary, false);  // the next pass first, then the delivery: as a worker
        }
        if (delivery >= 0) {
            send_all(delivery, &got, sizeof got);
        }
        if (round_done) {
            const int32_t done = -1;  // a round: the parent times it and starts the next
            send_all(report, &done, sizeof done);
            ++round;
        }
    }
    if (!stopped) {
        std::_Exit(1);  // a neighbour ended without the stop: the parent sees this stage's report close
    }
    const double cpu_us = passes > 0 ? (cpu_seconds() - cpu_start) / (double) passes * 1e6 : 0.0;
    const double decode_us = passes > 0 ? stage.decode_seconds / (double) passes * 1e6 : 0.0;
    send_all(report, &cpu_us, sizeof cpu_us);
    send_all(report, &decode_us, sizeof decode_us);
    const int32_t n_picks = stage.last ? (int32_t) std::min<size_t>(picks.size(), (size_t) o.tokens) : 0;
    send_all(report, &n_picks, sizeof n_picks);
    if (n_picks > 0) {
        send_all(report, picks.data() + (picks.size() - (size_t) n_picks), (size_t) n_picks * sizeof(int32_t));
    }
    llama_free(stage.ctx);
    llama_model_free(stage.model);
    std::_Exit(0);
}

// The parent's way out of a failed run: no stage process outlives it.
[[noreturn]] void give_up(const std::string & why) {
    for (const pid_t pid : g_children) {
        kill(pid, SIGKILL);
    }
    for (const pid_t pid : g_children) {
        waitpid(pid, nullptr, 0);
    }
    std::fprintf(stderr, "dgr-ring-floor: %s\n", why.c_str());
    std::exit(1);
}

// Every end of ``links`` and ``reports`` but those in ``keep`` closed (each process holds only its own,
// so a process that ends closes the last copy of its ends and its neighbours see it).
void close_others(const std::vector<std::vector<int>> & links, const std::vector<std::vector<int>> & reports,
                  const std::vector<int> & keep) {
    for (const auto * group : {&links, &reports}) {
        for (const auto & pair : *group) {
            for (const int fd : pair) {
                if (std::find(keep.begin(), keep.end(), fd) == keep.end()) {
                    close(fd);
                }
            }
        }
    }
}

// The model's layer count from its GGUF header (ARCH.block_count), read once before the stages start.
int layer_count(const Options & o) {
    gguf_init_params gp{};
    gp.no_alloc = true;
    gguf_context * meta = gguf_init_from_file(o.model.c_str(), gp);
    if (meta == nullptr) {
        std::fprintf(stderr, "dgr-ring-floor: cannot read the GGUF header of %s\n", o.model.c_str());
        std::exit(1);
    }
    const int64_t arch = gguf_find_key(meta, "general.architecture");
    const std::string key = arch >= 0 ? std::string(gguf_get_val_str(meta, arch)) + ".block_count" : "";
    const int64_t blocks = arch >= 0 ? gguf_find_key(meta, key.c_str()) : -1;
    const int n = blocks >= 0 ? (int) gguf_get_val_u32(meta, blocks) : 0;
    gguf_free(meta);
    if (n < o.stages) {
        std::fprintf(stderr, "dgr-ring-floor: %d stages for a model of %d layers\n", o.stages, n);
        std::exit(2);
    }
    return n;
}

}  // namespace

int main(int argc, char ** argv) {
    const Options o = parse(argc, argv);
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    const int n_layer = layer_count(o);
    // link[k]: stage k writes [0], stage k+1 (mod N) reads [1]; each stage reports on its own pair
    std::vector<std::vector<int>> link((size_t) o.stages), report((size_t) o.stages);
    for (int k = 0; k < o.stages; ++k) {
        int fds[2], rep[2];
        tcp_pair(fds);
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, rep) != 0) {
            std::perror("dgr-ring-floor: socketpair");
            return 1;
        }
        link[(size_t) k] = {fds[0], fds[1]};
        report[(size_t) k] = {rep[0], rep[1]};
    }
    for (int k = 0; k < o.stages; ++k) {
        const pid_t pid = fork();
        if (pid < 0) {
            give_up(std::string("fork: ") + std::strerror(errno));
        }
        if (pid == 0) {
            g_children.clear();  // a stage has none of its own
#ifdef __linux__
            prctl(PR_SET_PDEATHSIG, SIGKILL);  // a parent killed by a timeout takes its stages with it
#endif
            const int in = link[(size_t) ((k + o.stages - 1) % o.stages)][1], out = link[(size_t) k][0];
            close_others(link, report, {in, out, report[(size_t) k][1]});
            run_stage(o, n_layer, k, in, out, report[(size_t) k][1]);
        }
        g_children.push_back(pid);
    }
    // the parent feeds the first stage as the last stage would: through the last stage's link
    const int feed = link[(size_t) (o.stages - 1)][0], last_report = report[(size_t) (o.stages - 1)][0];
    std::vector<int> mine = {feed};
    for (const auto & pair : report) {
        mine.push_back(pair[0]);
    }
    close_others(link, report, mine);
    int32_t word = 0;
    for (int k = 0; k < o.stages; ++k) {
        if (!recv_all(report[(size_t) k][0], &word, sizeof word)) {
            give_up("stage " + std::to_string(k) + " ended before it was ready");
        }
    }
    std::vector<double> tok_s;
    for (int r = 0; r < o.rounds; ++r) {
        const Head start{0, 1};
        const auto t0 = std::chrono::steady_clock::now();
        send_all(feed, &start, sizeof start);
        if (!recv_all(last_report, &word, sizeof word)) {
            give_up("a stage ended in round " + std::to_string(r + 1));
        }
        tok_s.push_back(o.tokens / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const Head stop{-1, 0};
    send_all(feed, &stop, sizeof stop);
    std::vector<double> cpu_us((size_t) o.stages), decode_us((size_t) o.stages);
    std::vector<int32_t> tokens;
    for (int k = 0; k < o.stages; ++k) {
        int32_t n = 0;
        const int from = report[(size_t) k][0];
        if (!recv_all(from, &cpu_us[(size_t) k], sizeof(double)) ||
            !recv_all(from, &decode_us[(size_t) k], sizeof(double)) || !recv_all(from, &n, sizeof n)) {
            give_up("stage " + std::to_string(k) + " ended without its figures");
        }
        tokens.resize((size_t) n);
        if (n > 0 && !recv_all(from, tokens.data(), (size_t) n * sizeof(int32_t))) {
            give_up("stage " + std::to_string(k) + " ended without its tokens");
        }
    }
    for (const pid_t pid : g_children) {
        waitpid(pid, nullptr, 0);
    }
    auto list = [](const auto & v, const char * fmt) {
        std::string s = "[";
        char buf[64];
        for (size_t i = 0; i < v.size(); ++i) {
            std::snprintf(buf, sizeof buf, fmt, v[i]);
            s += (i ? ", " : "") + std::string(buf);
        }
        return s + "]";
    };
    std::printf("{\"stages\": %d, \"threads\": %d, \"load_mode\": \"%s\", \"tokens_per_round\": %d, \"tok_s\": %s, "
                "\"cpu_us_per_pass\": %s, \"decode_us_per_pass\": %s, \"tokens\": %s}\n",
                o.stages, o.threads, llama_load_mode_name(dgr::choose_load_mode("", o.gpu_layers)), o.tokens,
                list(tok_s, "%.2f").c_str(), list(cpu_us, "%.1f").c_str(), list(decode_us, "%.1f").c_str(),
                list(tokens, "%d").c_str());
    return 0;
}
