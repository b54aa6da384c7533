// Command line of dgr-shard-worker.
#pragma once

#include "usage_error.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dgr {

struct WorkerOptions {
    std::string model_path;   // first split file of the GGUF
    int32_t layer_begin = 0;  // owned range [begin, end); end = -1: up to the last layer
    int32_t layer_end = -1;
    std::string listen = "127.0.0.1:0";
    int32_t n_threads = 0;  // 0: hardware concurrency
    int32_t n_ctx = 4096;
    int32_t n_batch = 512;  // max tokens per Forward; also the physical ubatch (one ubatch per call)
    int32_t max_sessions = 4;
    int32_t max_rewind = 0;          // positions a rewinding Forward may take back (speculative decoding)
    int32_t pass_port = 0;           // TCP port of streamed ring passes (on the --listen host); 0: any free one
    std::string record_passes_dir;   // --record-passes: write each pass read there (the fuzz corpus); "": none
    bool mtp = false;                // last stage: load the nextn block and draft with it
    bool census = false;             // --census: count the compressed state the passes fill (state_census.h)
    std::string mtp_model_path;      // --mtp-model: the block comes as an MTP-only GGUF of its own (implies mtp)
    int32_t n_gpu_layers = -1;       // llama's default: offload everything the lane can
    std::string load_mode;           // --load: llama's load mode name; "": none for host weights, else auto (weights.h)
    std::string identity_path;       // opaque identity JSON reported by Info
    std::string lane;                // reported by Info; defaults to the lane compiled in
    std::vector<int> cpus;           // --cpus: the CPUs the worker's threads run on (worker/README.md); empty: any
    std::string cpus_text;           // --cpus as given (Info reports it)
    std::vector<std::string> peers;  // --peers: HOST:PORT / HOST:* a chained call may make us dial; empty: any
    bool stop_on_stdin_eof = false;  // stdin's end means the launcher is gone: stop as on SIGTERM
    std::string tls_dir;             // --tls: cert.pem, key.pem, ca.pem: mutual TLS on every gRPC channel
    bool insecure = false;           // --insecure: plaintext on a --listen host other hosts can reach
    std::string pass_frames = "tls";    // --pass-frames: "tls" records, or "mac" frames where both ends allow
    int32_t max_pass_connections = 16;  // --max-pass-connections: held at once on the pass port
    bool verbose = false;
};

// Splits "HOST:PORT" at its last colon; false unless both parts are there and PORT is "*" (when
// ``wildcard``) or a decimal port 1..65535. "[::1]:7001" gives host "[::1]".
bool split_host_port(const std::string & address, std::string & host, std::string & port, bool wildcard);

// True for an address only this host can reach: 127.0.0.0/8, ::1, localhost.
bool is_loopback_host(const std::string & host);

// What Info reports of the gRPC port: "mtls", "plaintext-loopback" or "plaintext-insecure".
std::string transport_of(const WorkerOptions & opts);
// What Info reports of the pass port's frames: "tls", "mac" (allowed; mac_frames.h) or "plaintext".
std::string pass_frames_of(const WorkerOptions & opts);

// Parses argv; throws UsageError with a message naming the bad argument.
// Returns false when --help was asked (usage already printed).
bool parse_options(int argc, char ** argv, WorkerOptions & out);

const char * usage_text();

}  // namespace dgr
