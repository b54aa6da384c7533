#include "secure_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>

namespace dgr {

namespace {
std::string tls_error(const char * what) {
    const unsigned long e = ERR_get_error();
    char buf[256] = "no detail from OpenSSL";
    if (e != 0) {
        ERR_error_string_n(e, buf, sizeof buf);
    }
    ERR_clear_error();
    return std::string(what) + ": " + buf;
}

struct FreeBio {
    void operator()(BIO * b) const { BIO_free(b); }
};

std::unique_ptr<BIO, FreeBio> pem(const std::string & text) {
    return std::unique_ptr<BIO, FreeBio>(BIO_new_mem_buf(text.data(), (int) text.size()));
}

// ALPN on the accepting end that allows authenticated frames: chosen when the dialing end offers them;
// otherwise no protocol, and the connection runs TLS records.
int choose_mac_frames(SSL *, const unsigned char ** out, unsigned char * out_len, const unsigned char * offered,
                      unsigned int offered_len, void *) {
    unsigned char * chosen = nullptr;
    if (SSL_select_next_proto(&chosen, out_len, kMacFramesAlpn, sizeof kMacFramesAlpn - 1, offered, offered_len) !=
        OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_NOACK;
    }
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
}

// The identity's certificate and key, and its CA as the only trust anchor; TLS 1.3, peer required.
SSL_CTX * make_context(const TlsFiles & files, bool accepting) {
    SSL_CTX * ctx = SSL_CTX_new(accepting ? TLS_server_method() : TLS_client_method());
    if (ctx == nullptr) {
        throw std::runtime_error(tls_error("TLS context"));
    }
    X509 * cert = PEM_read_bio_X509(pem(files.cert).get(), nullptr, nullptr, nullptr);
    EVP_PKEY * key = PEM_read_bio_PrivateKey(pem(files.key).get(), nullptr, nullptr, nullptr);
    const bool own = cert != nullptr && key != nullptr && SSL_CTX_use_certificate(ctx, cert) == 1 &&
                     SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
    X509_free(cert);
    EVP_PKEY_free(key);
    int anchors = 0;
    auto cas = pem(files.ca);
    while (X509 * ca = PEM_read_bio_X509(cas.get(), nullptr, nullptr, nullptr)) {
        anchors += X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca) == 1;
        X509_free(ca);
    }
    ERR_clear_error();  // the end of the CA file reads as an error
    if (!own || anchors == 0) {
        SSL_CTX_free(ctx);
        throw std::runtime_error(own ? "--tls: ca.pem holds no certificate"
                                     : "--tls: cert.pem and key.pem are not a certificate and its key");
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    // read what has arrived in one call, records and all, instead of a header and a body per record: a
    // 64 KiB boundary is four records
    SSL_CTX_set_read_ahead(ctx, 1);
    // AES-128-GCM first: as strong as the handshake's P-256 keys, and four rounds fewer than AES-256
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
    SSL_CTX_set_default_read_buffer_len(ctx, 1 << 18);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // no session tickets: nothing resumes, and no record may follow the handshake on a connection that
    // goes on in authenticated frames
    SSL_CTX_set_num_tickets(ctx, 0);
    return ctx;
}

// ``ctx`` allowing authenticated frames where ``mac_frames`` says so: the accepting end chooses them when
// offered, the dialing end offers them; unchanged otherwise.
SSL_CTX * with_frames(SSL_CTX * ctx, bool accepting, bool mac_frames) {
    if (!mac_frames) {
        return ctx;
    }
    if (accepting) {
        SSL_CTX_set_alpn_select_cb(ctx, choose_mac_frames, nullptr);
    } else if (SSL_CTX_set_alpn_protos(ctx, kMacFramesAlpn, sizeof kMacFramesAlpn - 1) != 0) {  // 0: set
        SSL_CTX_free(ctx);
        throw std::runtime_error(tls_error("ALPN"));
    }
    return ctx;
}

void set_timeouts(int fd, std::chrono::milliseconds limit) {
    timeval t{(time_t) (limit.count() / 1000), (suseconds_t) (limit.count() % 1000 * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t);
}

// The socket under a session: read directly, written through a buffer that write_frame flushes (once for
// a small frame; per record for a large one, so the reader opens each record while the next is sealed).
bool attach(SSL * ssl, int fd) {
    BIO * socket_bio = BIO_new_socket(fd, BIO_NOCLOSE);
    BIO * buffer = BIO_new(BIO_f_buffer());
    if (socket_bio == nullptr || buffer == nullptr || BIO_set_write_buffer_size(buffer, 1 << 18) != 1 ||
        BIO_up_ref(socket_bio) != 1) {
        BIO_free(socket_bio);
        BIO_free(buffer);
        return false;
    }
    BIO_push(buffer, socket_bio);  // buffer's next is the socket: one reference each, read and write
    SSL_set0_rbio(ssl, socket_bio);
    SSL_set0_wbio(ssl, buffer);
    return true;
}

std::string unbracket(const std::string & host) {
    return host.size() > 1 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
}
}  // namespace

TlsContexts::TlsContexts(const TlsFiles & files, bool mac_frames)
    : accepting_(with_frames(make_context(files, true), true, mac_frames)),
      dialing_pass_(with_frames(make_context(files, false), false, mac_frames)), dialing_(make_context(files, false)) {}

Link::~Link() {
    if (ssl_ != nullptr) {
        SSL_free(ssl_);
    }
}

bool Link::handshake(bool accepting, std::chrono::milliseconds deadline, std::string & why) {
    set_timeouts(fd_, deadline);  // a peer that sends nothing gives its thread back at the deadline
    // no read-ahead during the handshake: what follows it on authenticated frames stays in the socket
    SSL_set_read_ahead(ssl_, 0);
    const int rc = accepting ? SSL_accept(ssl_) : SSL_connect(ssl_);
    const int saved = errno;
    set_timeouts(fd_, std::chrono::milliseconds(0));  // none: a kept connection waits between rings
    if (rc == 1) {
        return choose_frames(accepting, why);
    }
    const long verified = SSL_get_verify_result(ssl_);
    why = verified != X509_V_OK   ? std::string("TLS handshake: ") + X509_verify_cert_error_string(verified)
          : ERR_peek_error() != 0 ? tls_error("TLS handshake")
          : saved == EAGAIN || saved == EWOULDBLOCK
              ? "TLS handshake: no answer within " + std::to_string(deadline.count()) + " ms"
              : std::string("TLS handshake: ") + (saved != 0 ? std::strerror(saved) : "the peer closed");
    ERR_clear_error();
    return false;
}

bool Link::choose_frames(bool accepting, std::string & why) {
    const unsigned char * chosen = nullptr;
    unsigned int chosen_len = 0;
    SSL_get0_alpn_selected(ssl_, &chosen, &chosen_len);
    if (chosen_len == 0) {
        SSL_set_read_ahead(ssl_, 1);  // TLS records, read as they arrive
        return true;
    }
    if (chosen_len != sizeof kMacFramesAlpn - 2 || std::memcmp(chosen, kMacFramesAlpn + 1, chosen_len) != 0) {
        why = "TLS handshake: the peer chose a protocol this worker does not speak";
        return false;
    }
    if (SSL_has_pending(ssl_) == 1) {
        why = "authenticated frames: TLS records followed the handshake";
        return false;
    }
    mac_ = std::make_unique<MacFrames>();
    return mac_->key(ssl_, accepting, why);
}

bool Link::accept_tls(SSL_CTX * ctx, std::chrono::milliseconds deadline, std::string & why) {
    ssl_ = SSL_new(ctx);
    return ssl_ != nullptr && attach(ssl_, fd_) ? handshake(true, deadline, why)
                                                : (why = tls_error("TLS session"), false);
}

bool Link::connect_tls(SSL_CTX * ctx, const std::string & host, std::chrono::milliseconds deadline, std::string & why) {
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || !attach(ssl_, fd_)) {
        why = tls_error("TLS session");
        return false;
    }
    // the peer's certificate must name the address dialed, as the gRPC channels check it
    const std::string bare = unbracket(host);
    in6_addr ip{};
    const bool literal = inet_pton(AF_INET, bare.c_str(), &ip) == 1 || inet_pton(AF_INET6, bare.c_str(), &ip) == 1;
    X509_VERIFY_PARAM * param = SSL_get0_param(ssl_);
    const int named = literal ? X509_VERIFY_PARAM_set1_ip_asc(param, bare.c_str())
                              : X509_VERIFY_PARAM_set1_host(param, bare.c_str(), 0);
    if (named != 1) {
        why = tls_error("TLS peer name");
        return false;
    }
    if (!literal) {
        SSL_set_tlsext_host_name(ssl_, bare.c_str());
    }
    return handshake(false, deadline, why);
}

bool Link::read_exact(char * buf, size_t n) {
    while (n > 0) {
        const int got = SSL_read(ssl_, buf, (int) std::min(n, (size_t) INT_MAX));
        if (got > 0) {
            buf += got;
            n -= (size_t) got;
        } else if (SSL_get_error(ssl_, got) == SSL_ERROR_SYSCALL && errno == EINTR) {
            continue;
        } else {
            ERR_clear_error();
            return false;  // closed, shut down, failed, or a record that does not authenticate
        }
    }
    return true;
}

FrameRead Link::read_frame(int64_t max_bytes, std::string & body, uint32_t & announced) {
    if (mac_ != nullptr) {
        return mac_->read_frame(fd_, max_bytes, body, announced);
    }
    if (ssl_ == nullptr) {
        return dgr::read_frame(fd_, max_bytes, body, announced);
    }
    return read_frame_by([this](char * buf, size_t n) { return read_exact(buf, n); }, max_bytes, body, announced);
}

bool Link::write_frame(const std::string & body, std::string & why) {
    if (mac_ != nullptr) {
        return mac_->write_frame(fd_, body, why);
    }
    if (ssl_ == nullptr) {
        return dgr::write_frame(fd_, body, why);
    }
    // A frame that fits one record goes as one (head and body copied together: one seal, one write(2)).
    // A larger one goes as the head's record, then the body's records each flushed as soon as it is
    // sealed, with no copy of the body: the reader opens record k while this side seals record k+1
    // (a 64 KiB crossing 78 -> 61 us on the quiet 2-core box against one flush per frame; records of
    // 8 KiB were slower again: docs/measurements/issue-43).
    bool put;
    if (body.size() + 4 <= kRecordBytes) {
        small_.resize(4 + body.size());
        frame_head((uint32_t) body.size(), small_.data());
        std::memcpy(small_.data() + 4, body.data(), body.size());
        put = SSL_write(ssl_, small_.data(), (int) small_.size()) > 0 && BIO_flush(SSL_get_wbio(ssl_)) == 1;
    } else {
        char head[4];
        frame_head((uint32_t) body.size(), head);
        put = SSL_write(ssl_, head, sizeof head) > 0;
        for (size_t at = 0; put && at < body.size(); at += kRecordBytes) {
            const size_t n = std::min(kRecordBytes, body.size() - at);
            put = SSL_write(ssl_, body.data() + at, (int) n) > 0 && BIO_flush(SSL_get_wbio(ssl_)) == 1;
        }
    }
    if (put) {
        return true;
    }
    why =
        errno == EAGAIN || errno == EWOULDBLOCK ? "the peer read nothing within the deadline" : tls_error("TLS write");
    return false;
}

bool Link::read_available(std::string & out, std::string & why) {
    if (mac_ != nullptr) {  // only delivery streams read this way, and they dial in TLS records
        why = "authenticated frames are read a frame at a time";
        return false;
    }
    if (ssl_ == nullptr) {
        return dgr::read_available(fd_, out, why);
    }
    const int flags = fcntl(fd_, F_GETFL);
    fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
    char buf[4096];
    bool open = true;
    for (;;) {
        const int got = SSL_read(ssl_, buf, sizeof buf);
        if (got > 0) {
            out.append(buf, (size_t) got);
            continue;
        }
        const int err = SSL_get_error(ssl_, got);
        if (err == SSL_ERROR_WANT_READ) {
            break;
        }
        if (err == SSL_ERROR_SYSCALL && errno == EINTR) {
            continue;
        }
        why = err == SSL_ERROR_ZERO_RETURN ? "the peer closed the connection" : tls_error("TLS read");
        open = false;
        break;
    }
    fcntl(fd_, F_SETFL, flags);
    return open;
}

}  // namespace dgr
