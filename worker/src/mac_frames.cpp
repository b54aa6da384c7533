#include "mac_frames.h"

#include <openssl/crypto.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <new>

namespace dgr {

namespace {
constexpr char kExporterLabel[] = "EXPORTER-dgr-pass-frames";

// The iovecs a chunk is tagged over: the frame's head with the first chunk, then the chunk's bytes.
int chunk_parts(iovec parts[2], char * head, char * data, size_t n) {
    int count = 0;
    if (head != nullptr) {
        parts[count++] = {head, 4};
    }
    parts[count++] = {data, n};
    return count;
}

// The frame's tags as they come after its body: one per chunk, and one for an empty body (its head).
size_t tag_bytes(size_t body) {
    return std::max<size_t>(1, (body + MacFrames::kChunkBytes - 1) / MacFrames::kChunkBytes) * MacKey::kTagBytes;
}

// Whatever has arrived of ``body`` and then ``tags``, up to their end, until at least ``need`` bytes of
// the two are in (``arrived`` counts them); false when the peer closed or the read failed. One read takes
// the last chunk and the tags behind it together.
bool receive_until(int fd, std::string & body, std::string & tags, size_t & arrived, size_t need) {
    while (arrived < need) {
        iovec parts[2] = {};
        int count = 0;
        if (arrived < body.size()) {
            parts[count++] = {body.data() + arrived, body.size() - arrived};
        }
        const size_t into_tags = arrived > body.size() ? arrived - body.size() : 0;
        parts[count++] = {tags.data() + into_tags, tags.size() - into_tags};
        msghdr msg{};
        msg.msg_iov = parts;
        msg.msg_iovlen = (size_t) count;
        const ssize_t got = recvmsg(fd, &msg, 0);
        if (got > 0) {
            arrived += (size_t) got;
        } else if (got < 0 && errno == EINTR) {
            continue;
        } else {
            return false;
        }
    }
    return true;
}
}  // namespace

MacKey::MacKey() : ctx_(EVP_CIPHER_CTX_new()) {
    if (ctx_ == nullptr) {
        throw std::bad_alloc();
    }
}

MacKey::~MacKey() {
    EVP_CIPHER_CTX_free(ctx_);
}

bool MacKey::set(const unsigned char key[kKeyBytes]) {
    next_ = 0;
    return EVP_EncryptInit_ex(ctx_, EVP_chacha20_poly1305(), nullptr, key, nullptr) == 1;
}

bool MacKey::append_tag(const iovec * parts, int count, std::string & tags) {
    unsigned char nonce[12] = {0};  // 4 zero bytes, then the sequence number big-endian
    for (int i = 0; i < 8; ++i) {
        nonce[4 + i] = (unsigned char) (next_ >> (56 - 8 * i));
    }
    ++next_;
    int n = 0;
    unsigned char none[16];
    if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) != 1) {
        return false;
    }
    for (int k = 0; k < count; ++k) {  // the chunk is additional data: Poly1305 only, nothing encrypted
        const auto * bytes = static_cast<const unsigned char *>(parts[k].iov_base);
        if (parts[k].iov_len > 0 && EVP_EncryptUpdate(ctx_, nullptr, &n, bytes, (int) parts[k].iov_len) != 1) {
            return false;
        }
    }
    unsigned char tag[kTagBytes];
    if (EVP_EncryptFinal_ex(ctx_, none, &n) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, kTagBytes, tag) != 1) {
        return false;
    }
    tags.append(reinterpret_cast<const char *>(tag), kTagBytes);
    return true;
}

bool MacFrames::key(SSL * ssl, bool accepting, std::string & why) {
    unsigned char keys[2 * MacKey::kKeyBytes];
    if (SSL_export_keying_material(ssl, keys, sizeof keys, kExporterLabel, sizeof kExporterLabel - 1, nullptr, 0, 0) !=
        1) {
        why = "authenticated frames: the TLS session gave no keys";
        return false;
    }
    const unsigned char * dialer_sends = keys;
    const unsigned char * acceptor_sends = keys + MacKey::kKeyBytes;
    const bool keyed = accepting ? set_keys(acceptor_sends, dialer_sends) : set_keys(dialer_sends, acceptor_sends);
    OPENSSL_cleanse(keys, sizeof keys);
    if (!keyed) {
        why = "authenticated frames: ChaCha20-Poly1305 is not available";
    }
    return keyed;
}

bool MacFrames::set_keys(const unsigned char * send, const unsigned char * receive) {
    return send_.set(send) && receive_.set(receive);
}

bool MacFrames::write_frame(int fd, const std::string & body, std::string & why) {
    char head[4];
    frame_head((uint32_t) body.size(), head);
    char * data = const_cast<char *>(body.data());
    sent_tags_.clear();
    for (size_t at = 0;;) {
        const size_t take = std::min(kChunkBytes, body.size() - at);
        iovec parts[3] = {};
        const int count = chunk_parts(parts, at == 0 ? head : nullptr, data + at, take);
        at += take;
        if (at == body.size()) {  // the last chunk, with every tag of the frame behind it
            if (!send_.append_tag(parts, count, sent_tags_)) {
                why = "authenticated frames: tagging failed";
                return false;
            }
            parts[count] = {sent_tags_.data(), sent_tags_.size()};
            return send_all(fd, parts, count + 1, why);
        }
        iovec sending[2] = {parts[0], parts[1]};  // sent before it is tagged: the peer takes it in meanwhile
        if (!send_all(fd, sending, count, why)) {
            return false;
        }
        if (!send_.append_tag(parts, count, sent_tags_)) {
            why = "authenticated frames: tagging failed";
            return false;
        }
    }
}

FrameRead MacFrames::read_frame(int fd, int64_t max_bytes, std::string & body, uint32_t & announced) {
    char head[4];
    if (!read_exact(fd, head, sizeof head)) {
        return FrameRead::Closed;
    }
    announced = frame_length(head);  // not yet authenticated: it only bounds what is read, then is checked
    if (max_bytes >= 0 && (int64_t) announced > max_bytes) {
        return FrameRead::TooLong;
    }
    body.resize(announced);
    read_tags_.resize(tag_bytes(announced));
    expected_tags_.clear();
    size_t at = 0, arrived = 0;
    do {  // each chunk is tagged as soon as it is in, while the next arrives
        const size_t take = std::min(kChunkBytes, body.size() - at);
        if (!receive_until(fd, body, read_tags_, arrived, at + take)) {
            return FrameRead::Closed;
        }
        iovec parts[2] = {};
        const int count = chunk_parts(parts, at == 0 ? head : nullptr, body.data() + at, take);
        if (!receive_.append_tag(parts, count, expected_tags_)) {
            return FrameRead::Forged;
        }
        at += take;
    } while (at < body.size());
    if (!receive_until(fd, body, read_tags_, arrived, body.size() + read_tags_.size())) {
        return FrameRead::Closed;
    }
    return CRYPTO_memcmp(read_tags_.data(), expected_tags_.data(), expected_tags_.size()) == 0 ? FrameRead::Whole
                                                                                               : FrameRead::Forged;
}

}  // namespace dgr
