#include "options.h"

#include "affinity.h"
#include "weights.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace dgr {

const char * usage_text() {
    return "usage: dgr-shard-worker --model FILE --layers BEGIN:END --listen HOST:PORT\n"
           "                        [--threads N] [--ctx N] [--batch N] [--max-sessions N] [--max-rewind N]\n"
           "                        [--pass-port N] [--record-passes DIR] [--cpus LIST] [--load MODE]\n"
           "                        [--mtp | --mtp-model FILE]\n"
           "                        [--n-gpu-layers N] [--identity FILE] [--lane NAME]\n"
           "                        [--peers HOST:PORT,HOST:*,...] [--tls DIR | --insecure]\n"
           "                        [--pass-frames tls|mac] [--max-pass-connections N] [--census]\n"
           "                        [--stop-on-stdin-eof] [--verbose]\n"
           "\n"
           "One pipeline stage owning layers [BEGIN, END) of the model (END may be 'end' or -1 for the last\n"
           "layer). --listen HOST:0 picks a free port. When serving, prints one line\n"
           "'DGR-WORKER-LISTENING HOST:PORT' on stdout; logs go to stderr. SIGTERM/SIGINT stop it cleanly.\n"
           "--peers: the only addresses a chained Forward may make this worker connect to (the next stages;\n"
           "HOST:* for any port of a host, such as the driver's sink); without it any address is dialed.\n"
           "--stop-on-stdin-eof: stop as on SIGTERM when stdin reaches its end (a launcher that holds the\n"
           "other end of a pipe takes its workers with it when it dies, even by SIGKILL).\n"
           "--max-rewind: most positions a Forward with rewind set may take back (speculative decoding's\n"
           "rejected drafts; architectures with rolling state keep that many snapshots). Default 0: none.\n"
           "--pass-port N: the TCP port (on the --listen host) a streamed ring's passes arrive on; default 0,\n"
           "a free one (Info's pass_port names it). Fix it where a firewall must let it through.\n"
           "--record-passes DIR: also write each pass the pass port reads to DIR, one file each (its serialized\n"
           "ForwardRequest; the first 256): real passes for the fuzz targets' corpus (worker/fuzz).\n"
           "--cpus LIST: run the worker's threads on these CPUs only (a Linux CPU list such as 0-3,8), as\n"
           "taskset would, but for the ring's delivery thread (it only talks to the driver); for hosts that\n"
           "run several stages (worker/README.md, \"CPU affinity\").\n"
           "--load MODE: how the weights are loaded, as llama.cpp names it (none, mmap, mlock, mmap+mlock, dio,\n"
           "auto). Default: none where the weights stay in host memory (read into the worker's memory, on\n"
           "huge pages where the kernel gives them), else auto (worker/README.md, \"Weights in memory\").\n"
           "--mtp: the last stage loads the model's nextn (MTP) block and drafts with it (docs/mtp.md).\n"
           "--tls DIR: mutual TLS on the gRPC port and on the channels this worker opens (DIR holds cert.pem,\n"
           "key.pem and ca.pem, as `dgr tls` writes them): a client without a certificate of that CA is refused.\n"
           "Without it the worker serves plaintext, on a loopback --listen only, unless --insecure says so.\n"
           "The pass port and the ring's delivery streams then run mutual TLS too.\n"
           "--pass-frames mac: with --tls, a pass port connection whose other end allows it too carries\n"
           "authenticated frames (a Poly1305 tag per 24 KiB, keyed by the TLS handshake) instead of TLS\n"
           "records: cheaper per crossing, but the boundary crosses unencrypted. Default tls (encrypted).\n"
           "--max-pass-connections N: connections held at once on the pass port (default 16); one more\n"
           "evicts the oldest not yet proven (TLS handshake, or a first whole pass) or is refused.\n"
           "--census: count, per layer, the compressed and sliding-window state the passes fill (DeepSeek V4's\n"
           "CSA/HCA caches and indexer; Info's census; worker/src/state_census.h). Off by default.\n"
           "--mtp-model FILE: as --mtp, with the block read from an MTP-only GGUF (the pinned converter's\n"
           "--mtp output: the block, its own token embedding and output head) instead of the main file.\n";
}

static int32_t parse_int(const std::string & flag, const std::string & text, int32_t lo, int32_t hi) {
    errno = 0;
    char * end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || errno != 0 || end == nullptr || *end != '\0' || v < lo || v > hi) {
        throw UsageError(flag + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got '" + text + "'");
    }
    return (int32_t) v;
}

static void parse_layers(const std::string & text, WorkerOptions & out) {
    const auto colon = text.find(':');
    if (colon == std::string::npos) {
        throw UsageError("--layers: expected BEGIN:END, got '" + text + "'");
    }
    const std::string b = text.substr(0, colon);
    const std::string e = text.substr(colon + 1);
    out.layer_begin = parse_int("--layers", b, 0, INT32_MAX);
    out.layer_end = (e == "end" || e == "-1") ? -1 : parse_int("--layers", e, 1, INT32_MAX);
    if (out.layer_end >= 0 && out.layer_end <= out.layer_begin) {
        throw UsageError("--layers: empty range '" + text + "' (END must be greater than BEGIN)");
    }
}

bool split_host_port(const std::string & address, std::string & host, std::string & port, bool wildcard) {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
        return false;
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find_first_of("/ \t") != std::string::npos) {
        return false;  // a gRPC target with a scheme or path (dns:///, unix:, ...) is not HOST:PORT
    }
    if (host.find(':') != std::string::npos && (host.front() != '[' || host.back() != ']')) {
        return false;  // an IPv6 host is written in brackets; "ipv4:1.2.3.4" is a scheme
    }
    if (port == "*") {
        return wildcard;
    }
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return false;
    }
    const int value = std::stoi(port);
    return value >= 1 && value <= 65535;
}

static void parse_peers(const std::string & text, WorkerOptions & out) {
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        const std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        std::string host, port;
        if (!split_host_port(entry, host, port, true)) {
            throw UsageError("--peers: expected HOST:PORT or HOST:* entries separated by commas, got '" + entry + "'");
        }
        out.peers.push_back(entry);
        if (comma == std::string::npos) {
            return;
        }
        start = comma + 1;
    }
}

static void check_load_mode(const std::string & val) {
    try {
        parse_load_mode(val);
    } catch (const std::invalid_argument & e) {
        throw UsageError(std::string("--load: ") + e.what());
    }
}

bool is_loopback_host(const std::string & host) {
    return host == "localhost" || host == "[::1]" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string pass_frames_of(const WorkerOptions & opts) {
    return opts.tls_dir.empty() ? "plaintext" : opts.pass_frames;
}

std::string transport_of(const WorkerOptions & opts) {
    if (!opts.tls_dir.empty()) {
        return "mtls";
    }
    return opts.insecure ? "plaintext-insecure" : "plaintext-loopback";
}

// Plaintext only where nobody else can connect, unless the operator says otherwise in so many words.
static void check_transport(const WorkerOptions & out) {
    if (!out.tls_dir.empty() && out.insecure) {
        throw UsageError("--tls and --insecure: choose one");
    }
    if (out.pass_frames == "mac" && out.tls_dir.empty()) {
        throw UsageError("--pass-frames mac needs --tls DIR (its keys come from the TLS handshake)");
    }
    const std::string host = out.listen.substr(0, out.listen.rfind(':'));
    if (out.tls_dir.empty() && !out.insecure && !is_loopback_host(host)) {
        throw UsageError("--listen " + out.listen +
                         ": other hosts can reach it; serve it with --tls DIR (mutual TLS, `dgr tls`) or "
                         "say --insecure for plaintext");
    }
}

bool parse_options(int argc, char ** argv, WorkerOptions & out) {
    bool have_model = false, have_layers = false, have_listen = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "-h" || arg == "--help") {
            std::fputs(usage_text(), stdout);
            return false;
        }
        if (arg == "--verbose") {
            out.verbose = true;
            continue;
        }
        if (arg == "--mtp") {
            out.mtp = true;
            continue;
        }
        if (arg == "--census") {
            out.census = true;
            continue;
        }
        if (arg == "--stop-on-stdin-eof") {
            out.stop_on_stdin_eof = true;
            continue;
        }
        if (arg == "--insecure") {
            out.insecure = true;
            continue;
        }
        if (i + 1 >= argc) {
            throw UsageError("missing value after " + arg);
        }
        const std::string val = argv[++i];
        if (arg == "--model") {
            out.model_path = val;
            have_model = true;
        } else if (arg == "--layers") {
            parse_layers(val, out);
            have_layers = true;
        } else if (arg == "--listen") {
            out.listen = val;
            have_listen = true;
        } else if (arg == "--threads") {
            out.n_threads = parse_int(arg, val, 1, 1024);
        } else if (arg == "--ctx") {
            out.n_ctx = parse_int(arg, val, 16, 1 << 24);
        } else if (arg == "--batch") {
            out.n_batch = parse_int(arg, val, 1, 1 << 20);
        } else if (arg == "--max-sessions") {
            out.max_sessions = parse_int(arg, val, 1, 4096);
        } else if (arg == "--max-rewind") {
            out.max_rewind = parse_int(arg, val, 0, 64);
        } else if (arg == "--pass-port") {
            out.pass_port = parse_int(arg, val, 0, 65535);
        } else if (arg == "--record-passes") {
            out.record_passes_dir = val;
        } else if (arg == "--n-gpu-layers") {
            out.n_gpu_layers = parse_int(arg, val, -1, 1 << 20);
        } else if (arg == "--identity") {
            out.identity_path = val;
        } else if (arg == "--lane") {
            out.lane = val;
        } else if (arg == "--peers") {
            parse_peers(val, out);
        } else if (arg == "--cpus") {
            out.cpus = parse_cpu_list(val);
            out.cpus_text = val;
        } else if (arg == "--mtp-model") {
            out.mtp_model_path = val;
            out.mtp = true;
        } else if (arg == "--max-pass-connections") {
            out.max_pass_connections = parse_int(arg, val, 1, 1024);
        } else if (arg == "--tls") {
            out.tls_dir = val;
        } else if (arg == "--pass-frames") {
            if (val != "tls" && val != "mac") {
                throw UsageError("--pass-frames: tls or mac, got '" + val + "'");
            }
            out.pass_frames = val;
        } else if (arg == "--load") {
            check_load_mode(val);
            out.load_mode = val;
        } else {
            throw UsageError("unknown argument '" + arg + "'");
        }
    }
    if (!have_model) {
        throw UsageError("--model is required");
    }
    if (!have_layers) {
        throw UsageError("--layers is required");
    }
    if (!have_listen) {
        throw UsageError("--listen is required");
    }
    if (out.listen.rfind(':') == std::string::npos) {
        throw UsageError("--listen: expected HOST:PORT, got '" + out.listen + "'");
    }
    check_transport(out);
    if (out.n_threads == 0) {
        // fixed from here on: the thread count is part of what the certifier records
        out.n_threads = (int32_t) std::max(1u, std::thread::hardware_concurrency());
    }
    if (out.n_batch > out.n_ctx) {
        out.n_batch = out.n_ctx;
    }
    return true;
}

}  // namespace dgr
