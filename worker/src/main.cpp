// dgr-shard-worker: one pipeline stage (a contiguous layer range of a GGUF model) served over gRPC.
//
// Exit codes: 0 clean shutdown (SIGTERM/SIGINT), 2 usage error, 6 runtime failure (model load,
// listen address, ...). stdout carries exactly one line, DGR-WORKER-LISTENING <host:port>; all
// logging goes to stderr.
#include "affinity.h"
#include "options.h"
#include "service.h"
#include "stage.h"
#include "tls.h"
#include "weights.h"

#include "ggml-backend.h"
#include "llama.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <pthread.h>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

#ifndef DGR_WORKER_VERSION
#define DGR_WORKER_VERSION "0.0.0"
#endif
#ifndef DGR_LLAMA_COMMIT
#define DGR_LLAMA_COMMIT "unknown"
#endif
#ifndef DGR_LANE
#define DGR_LANE ""
#endif

static bool g_verbose = false;

static void log_to_stderr(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_DEBUG && !g_verbose) {
        return;
    }
    std::fputs(text, stderr);
}

static std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        throw std::runtime_error("cannot read --identity file '" + path + "'");
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// A stop must end well inside a supervisor's grace before SIGKILL (the certifier's launcher waits 5 s):
// calls still in flight get kCallGraceSeconds and are then cancelled; whatever gRPC still waits on after
// kStopBoundSeconds, the process exits anyway.
constexpr int kCallGraceSeconds = 2;
constexpr int kStopBoundSeconds = 3;

// Shut the server down, then end the process without running gRPC's global shutdown.
//
// Why not return from main: when a write meets a full socket buffer (a reply to a slow or stalled peer,
// a shaped link), gRPC 1.51's TCP layer starts a backup poller on its executor thread that sits in
// epoll_wait for up to 10 s.  grpc_shutdown(), run by the last gRPC object's destructor, joins that
// thread (~ServerBuilder -> grpc_shutdown -> grpc_iomgr_shutdown -> Executor::ShutdownAll ->
// pthread_join), and a send stuck on such a peer completes only when that poll ends, so even
// Server::Shutdown's deadline does not bound it: the worker outlived the launcher's grace and was
// SIGKILLed (seen as "ignored SIGTERM for 5.0 s").  Once the server is down (or the bound has passed)
// nothing is left that needs an orderly teardown: the OS reclaims memory, sockets and devices.
[[noreturn]] static void stop_within(grpc::Server & server, std::chrono::seconds call_grace,
                                     std::chrono::seconds bound) {
    const auto signalled = std::chrono::steady_clock::now();
    auto stopped = std::make_shared<std::promise<void>>();
    std::future<void> done = stopped->get_future();
    std::thread([&server, stopped, call_grace] {
        server.Shutdown(std::chrono::system_clock::now() + call_grace);
        server.Wait();
        stopped->set_value();
    }).detach();
    if (done.wait_until(signalled + bound) == std::future_status::timeout) {
        std::fprintf(stderr, "dgr-shard-worker: gRPC still cancelling calls %lld s after the signal; exiting anyway\n",
                     (long long) bound.count());
    } else {
        std::fprintf(stderr, "dgr-shard-worker: stopped\n");
    }
    std::fflush(nullptr);
    std::_Exit(0);
}

// The launcher holds the write end of our stdin: when it dies, however it dies, the read sees the end
// of the pipe and we stop through the same path as SIGTERM (raised at the process, so the blocked
// signal reaches the sigwait thread).  Without this a SIGKILLed launcher leaves its workers running.
static void watch_launcher_pipe() {
    std::thread([] {
        char buf[256];
        for (;;) {
            const ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
            if (n > 0 || (n < 0 && errno == EINTR)) {
                continue;
            }
            break;
        }
        std::fprintf(stderr, "dgr-shard-worker: stdin ended (the launcher is gone); stopping\n");
        kill(getpid(), SIGTERM);
    }).detach();
}

int main(int argc, char ** argv) {
    dgr::WorkerOptions opts;
    try {
        if (!dgr::parse_options(argc, argv, opts)) {
            return 0;
        }
    } catch (const dgr::UsageError & e) {
        std::fprintf(stderr, "dgr-shard-worker: %s\n%s", e.what(), dgr::usage_text());
        return 2;
    }
    g_verbose = opts.verbose;
    if (!opts.cpus.empty()) {
        // before any thread exists: gRPC's, ggml's and the ring's threads all inherit the mask
        if (const std::string why = dgr::pin_process(opts.cpus); !why.empty()) {
            std::fprintf(stderr, "dgr-shard-worker: --cpus: %s\n", why.c_str());
            return 2;
        }
    }

    // A peer that closed its end makes a write fail with EPIPE, never kill the worker: OpenSSL's writes
    // on the pass ports and delivery streams (--tls) cannot ask for MSG_NOSIGNAL as our own sends do.
    std::signal(SIGPIPE, SIG_IGN);

    // Block the stop signals in every thread (gRPC and ggml threads inherit the mask); main waits for them.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    // A stop signal during the (possibly long) model load ends the process at once; after the server
    // is up it triggers the orderly shutdown in main.
    std::atomic<bool> serving{false};
    std::promise<int> stop_requested;
    std::thread signal_thread([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        if (!serving.load()) {
            std::fprintf(stderr, "dgr-shard-worker: signal %d before serving, exiting\n", sig);
            std::_Exit(0);
        }
        stop_requested.set_value(sig);
    });
    signal_thread.detach();
    if (opts.stop_on_stdin_eof) {
        watch_launcher_pipe();
    }

    llama_log_set(log_to_stderr, nullptr);
    ggml_backend_load_all();
    llama_backend_init();

    int exit_code = 0;
    try {
        dgr::BuildIdentity id;
        id.worker_version = DGR_WORKER_VERSION;
        id.llama_commit = DGR_LLAMA_COMMIT;
        id.lane = !opts.lane.empty() ? opts.lane : (std::string(DGR_LANE).empty() ? "cpu" : DGR_LANE);
        id.model_path = opts.model_path;
        if (!opts.identity_path.empty()) {
            id.identity_json = read_file(opts.identity_path);
        }

        dgr::Stage stage(opts);
        const int64_t huge = dgr::anon_huge_page_bytes();
        std::fprintf(stderr, "dgr-shard-worker: weights loaded (load mode %s); %s on huge pages\n",
                     stage.info().memory.load_mode.c_str(),
                     huge < 0 ? "this kernel does not say how much memory is"
                              : (std::to_string(huge >> 20) + " MiB of anonymous memory").c_str());
        dgr::ChainPolicy chain;
        chain.peers = opts.peers;
        chain.max_message_bytes = dgr::message_limit(stage.info());
        chain.max_pass_connections = opts.max_pass_connections;
        std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
        if (!opts.tls_dir.empty()) {
            const dgr::TlsFiles tls = dgr::read_tls_dir(opts.tls_dir);
            credentials = dgr::server_credentials(tls);
            chain.credentials = dgr::channel_credentials(tls);
            chain.raw_tls = std::make_shared<const dgr::TlsContexts>(tls, opts.pass_frames == "mac");
        }
        id.transport = dgr::transport_of(opts);
        id.pass_frames = dgr::pass_frames_of(opts);
        dgr::ShardService service(stage, id, chain);

        int port = 0;
        grpc::ServerBuilder builder;
        builder.AddListeningPort(opts.listen, credentials, &port);
        builder.RegisterService(&service);
        // logits of a long all_logits prefill exceed the defaults (4 MiB); the model's own bound instead
        builder.SetMaxReceiveMessageSize(chain.max_message_bytes);
        builder.SetMaxSendMessageSize(chain.max_message_bytes);
        std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
        if (!server || port == 0) {
            throw std::runtime_error("cannot listen on '" + opts.listen + "'");
        }

        const std::string host = opts.listen.substr(0, opts.listen.rfind(':'));
        const int pass_port = service.listen_passes(host, opts.pass_port, opts.record_passes_dir);
        std::fprintf(stdout, "DGR-WORKER-LISTENING %s:%d\n", host.c_str(), port);
        std::fflush(stdout);
        std::fprintf(stderr, "dgr-shard-worker: serving layers [%d, %d) of %s on %s:%d (ring passes on port %d)\n",
                     stage.info().layer_begin, stage.info().layer_end, opts.model_path.c_str(), host.c_str(), port,
                     pass_port);

        serving = true;
        const int sig = stop_requested.get_future().get();
        std::fprintf(stderr, "dgr-shard-worker: signal %d, shutting down\n", sig);
        service.stop_streams();  // a neighbour's next pass then fails at once and names this stage
        stop_within(*server, std::chrono::seconds(kCallGraceSeconds), std::chrono::seconds(kStopBoundSeconds));
    } catch (const std::exception & e) {
        std::fprintf(stderr, "dgr-shard-worker: %s\n", e.what());
        exit_code = 6;
    }

    llama_backend_free();
    return exit_code;
}
