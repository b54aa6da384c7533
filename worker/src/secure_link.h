// TLS over the worker's raw TCP connections, the pass ports (streams.h) and the ring's delivery
// streams (delivery_streams.h), when the worker has --tls (issue 43): the same frames either way, and a
// peer without a certificate of the worker's CA never gets a byte to the stage. Mutual: each end
// presents its certificate and checks the other's against the CA; the dialing end also checks the name.
//
// Why TLS (OpenSSL, TLS 1.3): the record layer gives authenticated, encrypted, ordered, replay-proof
// frames keyed per connection by a handshake both ends can check against the CA the gRPC port uses.
// Where both ends of a pass port's connection allow it (--pass-frames mac), that handshake's keys
// authenticate frames of our own without encrypting them instead (mac_frames.h): a 64 KiB boundary
// crosses in about 1.2x a plain crossing against about 1.8x over TLS records, readable on the wire.
// Both are measured in `nox -s bench -- -k tls` (tests/bench/test_bench_tls.py).
#pragma once

#include "mac_frames.h"
#include "sockets.h"
#include "tls.h"

#include <openssl/ssl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace dgr {

// The OpenSSL contexts of a worker's identity: accepting (pass port), dialing a pass port (the next
// stage's), and dialing the driver's delivery port (always TLS records: the driver reads no other).
// ``mac_frames``: the pass port contexts allow authenticated frames, chosen when the other end allows
// them too. Throws std::runtime_error when the files do not load.
class TlsContexts {
public:
    explicit TlsContexts(const TlsFiles & files, bool mac_frames = false);
    SSL_CTX * accepting() const { return accepting_.get(); }
    SSL_CTX * dialing_pass() const { return dialing_pass_.get(); }
    SSL_CTX * dialing() const { return dialing_.get(); }

private:
    struct Free {
        void operator()(SSL_CTX * ctx) const { SSL_CTX_free(ctx); }
    };
    std::unique_ptr<SSL_CTX, Free> accepting_;
    std::unique_ptr<SSL_CTX, Free> dialing_pass_;
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
    // Authenticated frames (mac_frames.h) after the handshake, instead of TLS records.
    bool mac_frames() const { return mac_ != nullptr; }
    // The handshake's session: what keys a twin of this connection's frames (worker/tools/pass_probe.cpp).
    SSL * session() const { return ssl_; }

private:
    bool handshake(bool accepting, std::chrono::milliseconds deadline, std::string & why);
    bool choose_frames(bool accepting, std::string & why);
    bool read_exact(char * buf, size_t n);

    static constexpr size_t kRecordBytes = 16384;  // TLS's largest record

    int fd_;
    SSL * ssl_ = nullptr;
    std::unique_ptr<MacFrames> mac_;
    std::string small_;  // a frame that fits one record, head and body together
};

}  // namespace dgr
