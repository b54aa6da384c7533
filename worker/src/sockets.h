// TCP helpers shared by the worker's raw connections (pass ports, worker/src/streams.h, and ring
// delivery streams, worker/src/delivery_streams.h): resolving, Nagle off, and the frame both use, a
// 4-byte little-endian length followed by that many bytes of a serialized message.
#pragma once

#include <netdb.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dgr {

// getaddrinfo for a TCP ``host`` (brackets allowed) and numeric ``port``; ``passive``: an address to
// bind (an empty host: any). Null when it does not resolve; the caller frees the list.
addrinfo * resolve(const std::string & host, int port, bool passive);

void no_delay(int fd);

// A connected TCP socket to ``host``:``port`` (each address it resolves to, in turn), Nagle off, or -1
// with ``why``. ``timeout``: how long a connect may take (0: the system's own limit).
int connect_tcp(const std::string & host, int port, std::chrono::milliseconds timeout, std::string & why);

// Exactly ``n`` bytes, retrying short reads; false when the peer closed, the socket was shut down, or
// the read failed.
bool read_exact(int fd, char * buf, size_t n);

// Every byte of ``parts`` in order, retrying partial writes (the iovecs are consumed); a closed peer is an
// error (``why``), not SIGPIPE.
bool send_all(int fd, iovec * parts, int count, std::string & why);

// The frame's 4-byte head for a body of ``n`` bytes, and the body length a head announces.
void frame_head(uint32_t n, char head[4]);
uint32_t frame_length(const char head[4]);

// One frame's body off ``fd`` into ``body``, a connection's buffer kept between frames (no allocation per
// pass); ``announced``: the length the frame's head gave. TooLong: over ``max_bytes`` (negative: no
// bound), and nothing of the body is read: the caller closes the connection. Closed: the peer closed,
// the socket was shut down or a read failed, mid-frame included. Forged: on authenticated frames
// (mac_frames.h), a chunk whose tag does not check; nothing of the frame may be used.
enum class FrameRead { Whole, Closed, TooLong, Forged };
FrameRead read_frame(int fd, int64_t max_bytes, std::string & body, uint32_t & announced);

// read_frame over any exact reader (``read_exact(buf, n)``: false when the bytes cannot all come), such
// as a TLS session's (secure_link.h).
template <class ReadExact>
FrameRead read_frame_by(ReadExact && read_exact, int64_t max_bytes, std::string & body, uint32_t & announced) {
    char head[4];
    if (!read_exact(head, sizeof head)) {
        return FrameRead::Closed;
    }
    announced = frame_length(head);
    if (max_bytes >= 0 && (int64_t) announced > max_bytes) {
        return FrameRead::TooLong;
    }
    body.resize(announced);
    return read_exact(body.data(), announced) ? FrameRead::Whole : FrameRead::Closed;
}

// What the peer has sent that can be read without waiting, appended to ``out``; false (``why``) when it
// closed the connection or the read failed.
bool read_available(int fd, std::string & out, std::string & why);

// A connection's serialization buffer is kept between frames up to this size (no allocation per pass
// or delivery), and released above it (a prefill's pass can be megabytes).
constexpr size_t kKeptFrameBytes = 1 << 20;

// Head and body in order in one call where the kernel takes them, retrying partial writes; a closed
// peer is an error (``why``), not SIGPIPE.
bool write_frame(int fd, const std::string & body, std::string & why);

}  // namespace dgr
