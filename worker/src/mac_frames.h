// Authenticated frames on a pass port (issue 43, `--pass-frames mac`): the pass port's own frames (a
// 4-byte length and a serialized ForwardRequest), unencrypted, each 24 KiB chunk of the body (the head
// rides on the first) authenticated by a Poly1305 tag, and the frame's tags after its body. Tags are
// ChaCha20-Poly1305 with the chunk as additional data and nothing encrypted (RFC 8439; OpenSSL's EVP),
// keyed per connection and direction from the mutual-TLS handshake that opened the connection (its
// exporter), with each chunk's sequence number on the connection as the nonce: a chunk altered, forged,
// replayed or moved fails its tag, and the connection is closed before any byte of its frame reaches
// the stage. A peer without a certificate of the CA never gets past the handshake.
//
// Why beside TLS records (secure_link.h): sealing a 64 KiB boundary with AES-GCM costs about 14 us per
// side on this class of CPU (OpenSSL 3.0, 4.4 GB/s), and a TLS crossing of it is 1.77x a plain one.
// Poly1305 alone runs about 12 GB/s. The shape was chosen by measurement (`dgr-link-floor`, 64 KiB,
// quiet 2-core box, mac/plain): a tag before each chunk of 16 KiB 1.38x; tags after the body with
// chunks of 16 KiB 1.39x, 20 KiB 1.24x, 24 KiB 1.22x, 32 KiB 1.26x, one 64 KiB chunk 1.49x; GMAC in
// place of Poly1305 at 24 KiB 1.28x. A chunk leaves before it is tagged, so the peer takes it in while
// this side tags it and tags it on arrival; a frame of fewer chunks has fewer sends to wait for.
// What it gives up: the boundary crosses the link readable, authenticated but not encrypted. A seam
// runs it only when both of its ends allow it (ALPN "dgr-mac-frames/1" offered by the dialing stage and
// chosen by the accepting one); TLS records otherwise.
#pragma once

#include "sockets.h"

#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <cstdint>
#include <string>

namespace dgr {

// The ALPN protocol that selects authenticated frames, length-prefixed as ALPN lists are.
inline constexpr unsigned char kMacFramesAlpn[] = "\x10"
                                                  "dgr-mac-frames/1";

// One direction's key and the sequence number of its next chunk.
class MacKey {
public:
    static constexpr size_t kKeyBytes = 32;
    static constexpr size_t kTagBytes = 16;

    MacKey();
    ~MacKey();
    MacKey(const MacKey &) = delete;
    MacKey & operator=(const MacKey &) = delete;

    bool set(const unsigned char key[kKeyBytes]);
    // Appends to ``tags`` the next chunk's tag over ``parts`` in order (the frame's head, then its bytes),
    // under the next sequence number.
    bool append_tag(const iovec * parts, int count, std::string & tags);

private:
    EVP_CIPHER_CTX * ctx_;
    uint64_t next_ = 0;
};

class MacFrames {
public:
    static constexpr size_t kChunkBytes = 24576;

    // Keys from the established session ``ssl``: the dialing end's sending key is the accepting end's
    // receiving key. False with ``why`` when the exporter fails.
    bool key(SSL * ssl, bool accepting, std::string & why);
    // Both directions' keys given, kKeyBytes each: what key() does with the exporter's, and the fuzz
    // target's fixed keys (worker/fuzz/mac_frames_fuzz.cpp).
    bool set_keys(const unsigned char * send, const unsigned char * receive);

    bool write_frame(int fd, const std::string & body, std::string & why);
    // As sockets.h's read_frame; Forged when a tag does not check (nothing of the frame may be used).
    FrameRead read_frame(int fd, int64_t max_bytes, std::string & body, uint32_t & announced);

private:
    MacKey send_;
    MacKey receive_;
    std::string sent_tags_;      // the frame being written's tags, sent after its last chunk
    std::string expected_tags_;  // the frame being read's tags, as its chunks arrive
    std::string read_tags_;      // and as its writer sent them
};

}  // namespace dgr
