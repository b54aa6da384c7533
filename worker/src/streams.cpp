#include "streams.h"

#include "options.h"
#include "sockets.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

namespace pb = dgr::shard::v1;

namespace dgr {

struct PassStreams::Out {
    std::mutex mu;  // one writer at a time
    int fd = -1;
    std::unique_ptr<Link> link;  // over fd: plain, or TLS (--tls)
    std::string body;            // the last pass sent, its capacity kept for the next (no allocation per pass)
};

namespace {
// How long a connection may take to prove itself in a TLS handshake before its thread is given back.
constexpr std::chrono::milliseconds kHandshakeDeadline(10000);
}  // namespace

PassStreams::~PassStreams() {
    stop();
}

int PassStreams::listen(const std::string & host, int port, OnPass on_pass) {
    on_pass_ = std::move(on_pass);
    addrinfo * found = resolve(host, port, true);
    if (found == nullptr) {
        throw std::runtime_error("pass port: cannot resolve '" + host + "'");
    }
    const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    const bool ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
                    bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
    freeaddrinfo(found);
    if (!ok) {
        const std::string why = std::strerror(errno);
        if (fd >= 0) {
            close(fd);
        }
        throw std::runtime_error("pass port: cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(fd, reinterpret_cast<sockaddr *>(&bound), &len);
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
    listen_fd_ = fd;
    std::thread([this] { accept_loop(); }).detach();
    return port_;
}

void PassStreams::accept_loop() {
    for (;;) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            return;  // the listener was shut down (stop) or failed
        }
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (stopping_) {
                close(fd);
                return;
            }
            if (!admit(lock, fd)) {
                close(fd);
                continue;
            }
        }
        no_delay(fd);
        std::thread([this, fd] { read_loop(fd); }).detach();
    }
}

bool PassStreams::admit(std::unique_lock<std::mutex> & lock, int fd) {
    const int limit = chain_.policy().max_pass_connections;
    if ((int) in_.size() >= limit) {
        auto oldest = in_.end();
        for (auto it = in_.begin(); it != in_.end(); ++it) {
            if (!it->second.proven && (oldest == in_.end() || it->second.order < oldest->second.order)) {
                oldest = it;
            }
        }
        if (oldest == in_.end()) {
            if (refused_++ % 100 == 0) {
                std::fprintf(stderr,
                             "dgr-shard-worker: pass port: %d connections held, each proven; refused a "
                             "connection (%llu so far)\n",
                             limit, (unsigned long long) refused_);
            }
            return false;
        }
        shutdown(oldest->first, SHUT_RDWR);  // its reader returns, closes it and frees its place
        oldest->second.proven = true;        // not chosen twice while its reader winds down
        // and gives its thread back before this connection takes one: a flood faster than evicted
        // readers end would otherwise hold their threads beyond the limit meanwhile
        gone_.wait_for(lock, kHandshakeDeadline, [&] { return stopping_ || (int) in_.size() < limit; });
        if (stopping_ || (int) in_.size() >= limit) {
            return false;
        }
    }
    in_[fd] = In{++accepted_, false};
    return true;
}

void PassStreams::read_loop(int fd) {
    {
        Link link(fd);
        std::string why;
        const TlsContexts * tls = chain_.policy().raw_tls.get();
        if (tls != nullptr && !link.accept_tls(tls->accepting(), kHandshakeDeadline, why)) {
            if (!stopping_) {
                std::fprintf(stderr, "dgr-shard-worker: pass port: closed a connection: %s\n", why.c_str());
            }
        } else {
            if (tls != nullptr) {
                std::lock_guard<std::mutex> lock(mu_);
                in_[fd].proven = true;
            }
            if (link.mac_frames()) {  // said once per connection: what crosses it can be read on the way
                std::fprintf(stderr, "dgr-shard-worker: pass port: a connection in authenticated frames (not "
                                     "encrypted)\n");
            }
            read_passes(fd, link);
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (in_.erase(fd)) {
        close(fd);  // stop() only shuts an fd down; the fd is closed by the one thread that reads it
    }
    gone_.notify_all();
}

void PassStreams::read_passes(int fd, Link & link) {
    pb::ForwardRequest pass;
    std::string body;
    bool proven = link.secure();  // a TLS peer proved itself in the handshake; a plain one by a whole pass
    for (;;) {
        uint32_t n = 0;
        const FrameRead got = link.read_frame(max_bytes_, body, n);
        if (got == FrameRead::TooLong) {
            std::fprintf(stderr,
                         "dgr-shard-worker: pass port: a %u-byte pass is over this model's limit of %d; "
                         "closing the connection\n",
                         n, max_bytes_);
        }
        if (got == FrameRead::Forged) {
            std::fprintf(stderr, "dgr-shard-worker: pass port: a frame that does not authenticate (altered, "
                                 "replayed or reordered); closing the connection\n");
        }
        if (got != FrameRead::Whole) {
            break;
        }
        const int64_t received_ns = monotonic_ns();
        if (!record_dir_.empty()) {
            record(body);
        }
        if (!pass.ParseFromString(body)) {
            std::fprintf(stderr, "dgr-shard-worker: pass port: a message that is not a ForwardRequest; closing the "
                                 "connection\n");
            break;
        }
        if (stopping_) {
            break;
        }
        if (!proven) {  // once per connection: no lock on the passes after its first
            std::lock_guard<std::mutex> lock(mu_);
            in_[fd].proven = proven = true;
        }
        on_pass_(pass, received_ns);
    }
}

void PassStreams::record(const std::string & body) {
    const int n = recorded_.fetch_add(1);
    if (n >= kRecordedPasses) {
        return;
    }
    const std::string path = record_dir_ + "/pass-" + std::to_string(getpid()) + "-" + std::to_string(n) + ".bin";
    FILE * f = std::fopen(path.c_str(), "wb");
    const bool written = f != nullptr && std::fwrite(body.data(), 1, body.size(), f) == body.size();
    if (f == nullptr || std::fclose(f) != 0 || !written) {
        std::fprintf(stderr, "dgr-shard-worker: --record-passes: cannot write %s: %s\n", path.c_str(),
                     std::strerror(errno));
    }
}

int PassStreams::pass_port_of(const std::string & address, std::string & why) {
    // the stage's own word for its pass port, asked on the channel the chain already uses
    pb::InfoReply info;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = pb::ShardWorker::NewStub(chain_.channel(address))->Info(&ctx, pb::InfoRequest(), &info);
    if (!s.ok()) {
        why = std::string("Info: ") + status_code_name(s.error_code()) + ": " + s.error_message();
        return -1;
    }
    if (info.pass_port() <= 0 || info.pass_port() > 65535) {
        why = "the stage offers no pass port (a worker that predates streamed rings)";
        return -1;
    }
    return info.pass_port();
}

bool PassStreams::connect_to(const std::string & address, Out & out, std::string & why) {
    const int pass_port = pass_port_of(address, why);
    if (pass_port < 0) {
        return false;
    }
    std::string host, port;
    split_host_port(address, host, port, false);
    const int fd = connect_tcp(host, pass_port, std::chrono::milliseconds(0), why);
    if (fd < 0) {
        why = "pass port: " + why;
        return false;
    }
    auto link = std::make_unique<Link>(fd);
    const TlsContexts * tls = chain_.policy().raw_tls.get();
    if (tls != nullptr && !link->connect_tls(tls->dialing_pass(), host, kHandshakeDeadline, why)) {
        why = "pass port: " + why;
        link.reset();
        close(fd);
        return false;
    }
    std::lock_guard<std::mutex> outer(mu_);  // stop() reads fd under mu_ alone
    out.fd = fd;
    out.link = std::move(link);
    if (stopping_) {
        shutdown(fd, SHUT_RDWR);
    }
    return true;
}

ChainResult PassStreams::send(const std::string & address, const pb::ForwardRequest & pass) {
    auto failed = [](const std::string & why) {
        return ChainResult{grpc::Status(grpc::StatusCode::UNAVAILABLE, why), ""};
    };
    std::shared_ptr<Out> out;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) {
            return failed("this worker is stopping");
        }
        auto & slot = out_[address];
        if (!slot) {
            slot = std::make_shared<Out>();
        }
        out = slot;
    }
    std::lock_guard<std::mutex> lock(out->mu);
    std::string & body = out->body;
    if (!pass.SerializeToString(&body) || (max_bytes_ >= 0 && body.size() > (size_t) max_bytes_)) {
        return ChainResult{
            grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                         "a pass of " + std::to_string(body.size()) + " bytes is over the message limit"),
            ""};
    }
    std::string why;
    if (out->fd < 0 && !connect_to(address, *out, why)) {
        return failed(why);
    }
    const bool sent = out->link->write_frame(body, why);
    if (body.capacity() > kKeptFrameBytes) {
        std::string().swap(body);
    }
    if (sent) {
        return ChainResult{};
    }
    std::lock_guard<std::mutex> outer(mu_);
    out->link.reset();
    close(out->fd);
    out->fd = -1;
    return failed("the pass connection broke: " + why);
}

void PassStreams::stop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.exchange(true)) {
        return;
    }
    if (listen_fd_ >= 0) {
        shutdown(listen_fd_, SHUT_RDWR);  // accept returns; the process is about to end, so no close race
    }
    for (const auto & [fd, in] : in_) {
        shutdown(fd, SHUT_RDWR);  // its reader's recv returns 0 and the reader closes it
    }
    gone_.notify_all();  // an accept waiting for an evicted reader gives up
    for (auto & [address, out] : out_) {
        if (out->fd >= 0) {
            shutdown(out->fd, SHUT_RDWR);  // a writer blocked in sendmsg fails at once
        }
    }
}

}  // namespace dgr
