// TLS over the worker's raw TCP connections, the pass ports (streams.h) and the ring's delivery
// streams (delivery_streams.h), when the worker has --tls (issue 43): the same frames either way, and a
// peer without a certificate of the worker's CA never gets a byte to the stage. Mutual: each end
// presents its certificate and checks the other's against the CA; the dialing end also checks the name.
//
// Why TLS (OpenSSL, TLS 1.3) and not frames of our own with a MAC: the record layer already gives
// authenticated, ordered, replay-proof frames keyed per connection by a handshake both ends can check
// against the CA the gRPC port uses, and AES-GCM runs on the CPU's AES instructions. What it costs per
// crossing is measured in `nox -s bench` (tests/bench).
#pragma once

#include "sockets.h"
#include "tls.h"

#include <openssl/ssl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace dgr {

// The two OpenSSL contexts of a worker's identity: accepting (pass port) and dialing (the next stage's
// pass port, the driver's delivery port). Throws std::runtime_error when the files do not load.
class TlsContexts {
public:
    explicit TlsContexts(const TlsFiles & files);
    SSL_CTX * accepting() const { return accepting_.get(); }
    SSL_CTX * dialing() const { return dialing_.get(); }

private:
    struct Free {
        void operator()(SSL_CTX * ctx) const { SSL_CTX_free(ctx); }
    };
    std::unique_ptr<SSL_CTX, Free> accepting_;
    std::unique_ptr<SSL_CTX, Free> dialing_;
};

// One connection's TLS session over a socket it does not own (the caller closes the fd, as before).
// Null session: plain TCP, and every call goes straight to the socket helpers.
class Link {
public:
    explicit Link(int fd) : fd_(fd) {}
    ~Link();
    Link(const Link &) = delete;
    Link & operator=(const Link &) = delete;

    // The handshake as the accepting or the dialing end, within ``deadline``; false with ``why``.
    bool accept_tls(SSL_CTX * ctx, std::chrono::milliseconds deadline, std::string & why);
    bool connect_tls(SSL_CTX * ctx, const std::string & host, std::chrono::milliseconds deadline, std::string & why);

    FrameRead read_frame(int64_t max_bytes, std::string & body, uint32_t & announced);
    bool write_frame(const std::string & body, std::string & why);
    // What the peer has sent that can be read without waiting, appended to ``out``; false (``why``) when
    // it closed the connection or the read failed.
    bool read_available(std::string & out, std::string & why);

    int fd() const { return fd_; }
    bool secure() const { return ssl_ != nullptr; }

private:
    bool handshake(bool accepting, std::chrono::milliseconds deadline, std::string & why);
    bool read_exact(char * buf, size_t n);

    static constexpr size_t kRecordBytes = 16384;  // TLS's largest record

    int fd_;
    SSL * ssl_ = nullptr;
    std::string small_;  // a frame that fits one record, head and body together
};

}  // namespace dgr
