// dgr-link-floor: what one crossing of a worker's raw connection costs, plain, over mutual TLS and in
// authenticated frames (issue 43): the pass port's own code (secure_link.h over sockets.h), two
// processes on loopback, no model and no protobuf in the way.
//
//   dgr-link-floor --tls DIR [--bytes 1024,65536] [--trips 2000] [--rounds 8]
//
// A child process accepts on 127.0.0.1 and echoes every frame back; the parent sends a frame of each
// size and waits for its echo, ``trips`` times per size and round, over a plain connection, over TLS
// records and in authenticated frames (mac_frames.h; DIR: cert.pem, key.pem, ca.pem, as `dgr tls`
// writes them, valid for 127.0.0.1), the three side by side in every round so a drifting machine moves
// all. A crossing is half a round trip.
//
// stdout: one JSON object: for each size, the median crossing of each round in microseconds (plain,
// tls, mac), and each round's tls/plain and mac/plain ratios. Exit 2 on bad usage, 1 when a connection
// fails or does not run the frames it was opened for.
#include "secure_link.h"
#include "sockets.h"
#include "tls.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kKinds = 3;  // plain, TLS records, authenticated frames
const char * const kKindNames[kKinds] = {"plain", "tls", "mac"};

struct Options {
    std::string tls_dir;
    std::vector<size_t> sizes{1024, 65536};
    int trips = 2000;
    int rounds = 8;
};

[[noreturn]] void usage(const std::string & why) {
    std::fprintf(stderr,
                 "dgr-link-floor: %s\nusage: dgr-link-floor --tls DIR [--bytes 1024,65536] [--trips 2000] "
                 "[--rounds 8]\n",
                 why.c_str());
    std::exit(2);
}

int positive(const std::string & flag, const std::string & text) {
    char * end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 1 || v > (1L << 26)) {
        usage(flag + ": not a positive count: " + text);
    }
    return (int) v;
}

Options parse(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            usage("missing the value of " + a);
        }
        const std::string v = argv[++i];
        if (a == "--tls") {
            o.tls_dir = v;
        } else if (a == "--trips") {
            o.trips = positive(a, v);
        } else if (a == "--rounds") {
            o.rounds = positive(a, v);
        } else if (a == "--bytes") {
            o.sizes.clear();
            std::stringstream list(v);
            for (std::string item; std::getline(list, item, ',');) {
                o.sizes.push_back((size_t) positive(a, item));
            }
        } else {
            usage("unknown option " + a);
        }
    }
    if (o.tls_dir.empty()) {
        usage("--tls DIR is required (the TLS side of the comparison)");
    }
    return o;
}

// The echoing child: every frame read goes straight back, on each connection in turn, until the
// parent closes it; the connection's index says which kind the parent opened (plain, TLS, mac frames).
[[noreturn]] void echo(int listener, const dgr::TlsContexts & contexts, int connections) {
    std::string body, why;
    for (int k = 0; k < connections; ++k) {
        const int fd = accept(listener, nullptr, nullptr);
        if (fd < 0) {
            _exit(1);
        }
        dgr::no_delay(fd);
        dgr::Link link(fd);
        if (k % kKinds != 0 && !link.accept_tls(contexts.accepting(), std::chrono::milliseconds(10000), why)) {
            std::fprintf(stderr, "dgr-link-floor: echo: %s\n", why.c_str());
            _exit(1);
        }
        uint32_t n = 0;
        while (link.read_frame(-1, body, n) == dgr::FrameRead::Whole) {
            if (!link.write_frame(body, why)) {
                break;
            }
        }
        close(fd);
    }
    _exit(0);
}

// The median crossing, in microseconds, of ``trips`` round trips of a ``size``-byte frame on ``link``.
double crossing_us(dgr::Link & link, size_t size, int trips) {
    const std::string out(size, '\x5a');
    std::string back, why;
    std::vector<double> us;
    us.reserve((size_t) trips);
    for (int t = 0; t < trips; ++t) {
        uint32_t n = 0;
        const auto start = std::chrono::steady_clock::now();
        if (!link.write_frame(out, why) || link.read_frame(-1, back, n) != dgr::FrameRead::Whole || n != size) {
            std::fprintf(stderr, "dgr-link-floor: a round trip failed: %s\n", why.c_str());
            std::exit(1);
        }
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / 2);
    }
    std::nth_element(us.begin(), us.begin() + (long) us.size() / 2, us.end());
    return us[us.size() / 2];
}

// A connection of ``kind`` to the echo on ``port``, checked to run the frames it was opened for; exits 1
// when it cannot.
class Opened {
public:
    Opened(const dgr::TlsContexts & contexts, int port, int kind) {
        std::string why;
        fd_ = dgr::connect_tcp("127.0.0.1", port, std::chrono::milliseconds(10000), why);
        link_ = std::make_unique<dgr::Link>(fd_);
        SSL_CTX * ctx = kind == 1 ? contexts.dialing() : contexts.dialing_pass();
        if (fd_ < 0 || (kind != 0 && !link_->connect_tls(ctx, "127.0.0.1", std::chrono::milliseconds(10000), why))) {
            std::fprintf(stderr, "dgr-link-floor: connect: %s\n", why.c_str());
            std::exit(1);
        }
        if (link_->mac_frames() != (kind == 2)) {
            std::fprintf(stderr, "dgr-link-floor: a %s connection did not run %s frames\n", kKindNames[kind],
                         kKindNames[kind]);
            std::exit(1);
        }
    }
    ~Opened() {
        link_.reset();
        close(fd_);
    }
    Opened(const Opened &) = delete;
    Opened & operator=(const Opened &) = delete;
    dgr::Link & link() { return *link_; }

private:
    int fd_ = -1;
    std::unique_ptr<dgr::Link> link_;
};

}  // namespace

int main(int argc, char ** argv) {
    const Options o = parse(argc, argv);
    std::signal(SIGPIPE, SIG_IGN);
    const dgr::TlsContexts contexts(dgr::read_tls_dir(o.tls_dir), true);
    const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in here{};
    here.sin_family = AF_INET;
    here.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof here;
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr *>(&here), len) != 0 || listen(listener, 4) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr *>(&here), &len) != 0) {
        std::perror("dgr-link-floor: listen");
        return 1;
    }
    const int port = ntohs(here.sin_port);
    const int connections = kKinds * o.rounds * (int) o.sizes.size();
    const pid_t child = fork();
    if (child == 0) {
        echo(listener, contexts, connections);
    }
    close(listener);
    std::printf("{\"trips\": %d, \"sizes\": [", o.trips);
    for (size_t s = 0; s < o.sizes.size(); ++s) {
        std::string us[kKinds], tls_ratio, mac_ratio;
        for (int r = 0; r < o.rounds; ++r) {
            double round_us[kKinds];
            for (int kind = 0; kind < kKinds; ++kind) {  // side by side in each round
                Opened opened(contexts, port, kind);
                round_us[kind] = crossing_us(opened.link(), o.sizes[s], o.trips);
            }
            const char * sep = r == 0 ? "" : ", ";
            for (int kind = 0; kind < kKinds; ++kind) {
                us[kind] += sep + std::to_string(round_us[kind]);
            }
            tls_ratio += sep + std::to_string(round_us[1] / round_us[0]);
            mac_ratio += sep + std::to_string(round_us[2] / round_us[0]);
        }
        std::printf("%s{\"bytes\": %zu", s == 0 ? "" : ", ", o.sizes[s]);
        for (int kind = 0; kind < kKinds; ++kind) {
            std::printf(", \"%s_us\": [%s]", kKindNames[kind], us[kind].c_str());
        }
        std::printf(", \"tls_over_plain\": [%s], \"mac_over_plain\": [%s]}", tls_ratio.c_str(), mac_ratio.c_str());
    }
    std::printf("]}\n");
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
