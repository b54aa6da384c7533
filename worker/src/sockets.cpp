#include "sockets.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dgr {

namespace {
std::string unbracket(const std::string & host) {
    return host.size() > 1 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
}

// connect(2) within ``timeout``: non-blocking, then poll for the outcome (a blocking connect to an
// unreachable host can take minutes, longer than any deadline of ours).
bool connect_within(int fd, const sockaddr * addr, socklen_t len, std::chrono::milliseconds timeout) {
    const int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    bool ok = connect(fd, addr, len) == 0;
    if (!ok && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int err = 0;
        socklen_t err_len = sizeof err;
        if (poll(&p, 1, (int) timeout.count()) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0) {
            errno = err;
            ok = err == 0;
        } else {
            errno = ETIMEDOUT;
        }
    }
    const int saved = errno;
    fcntl(fd, F_SETFL, flags);
    errno = saved;
    return ok;
}
}  // namespace

addrinfo * resolve(const std::string & host, int port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    const std::string bare = unbracket(host);
    addrinfo * found = nullptr;
    if (getaddrinfo(bare.empty() && passive ? nullptr : bare.c_str(), std::to_string(port).c_str(), &hints, &found) !=
        0) {
        return nullptr;
    }
    return found;
}

void no_delay(int fd) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int connect_tcp(const std::string & host, int port, std::chrono::milliseconds timeout, std::string & why) {
    addrinfo * found = resolve(host, port, false);
    if (found == nullptr) {
        why = "cannot resolve " + host;
        return -1;
    }
    int fd = -1;
    for (addrinfo * a = found; a != nullptr && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const bool ok = fd >= 0 && (timeout.count() > 0 ? connect_within(fd, a->ai_addr, a->ai_addrlen, timeout)
                                                        : connect(fd, a->ai_addr, a->ai_addrlen) == 0);
        if (fd >= 0 && !ok) {
            why = "connect to port " + std::to_string(port) + ": " + std::strerror(errno);
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    if (fd >= 0) {
        no_delay(fd);
    }
    return fd;
}

bool read_exact(int fd, char * buf, size_t n) {
    while (n > 0) {
        const ssize_t got = recv(fd, buf, n, 0);
        if (got > 0) {
            buf += got;
            n -= (size_t) got;
        } else if (got < 0 && errno == EINTR) {
            continue;
        } else {
            return false;  // closed by the peer, shut down, or failed
        }
    }
    return true;
}

void frame_head(uint32_t n, char head[4]) {
    head[0] = (char) (n & 0xff);
    head[1] = (char) (n >> 8 & 0xff);
    head[2] = (char) (n >> 16 & 0xff);
    head[3] = (char) (n >> 24 & 0xff);
}

uint32_t frame_length(const char head[4]) {
    const auto * h = reinterpret_cast<const unsigned char *>(head);
    return (uint32_t) h[0] | (uint32_t) h[1] << 8 | (uint32_t) h[2] << 16 | (uint32_t) h[3] << 24;
}

FrameRead read_frame(int fd, int64_t max_bytes, std::string & body, uint32_t & announced) {
    return read_frame_by([fd](char * buf, size_t n) { return read_exact(fd, buf, n); }, max_bytes, body, announced);
}

bool read_available(int fd, std::string & out, std::string & why) {
    char buf[4096];
    for (;;) {
        const ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0) {
            out.append(buf, (size_t) got);
            continue;
        }
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return true;
        }
        why = got == 0 ? "the peer closed the connection" : std::string("reading: ") + std::strerror(errno);
        return false;
    }
}

// Moves ``msg``'s iovecs past ``done`` bytes (a partial send or receive), dropping those finished.
static void advance(msghdr & msg, size_t done) {
    while (msg.msg_iovlen > 0 && done >= msg.msg_iov[0].iov_len) {
        done -= msg.msg_iov[0].iov_len;
        ++msg.msg_iov;
        --msg.msg_iovlen;
    }
    if (msg.msg_iovlen > 0) {
        msg.msg_iov[0].iov_base = static_cast<char *>(msg.msg_iov[0].iov_base) + done;
        msg.msg_iov[0].iov_len -= done;
    }
}

bool send_all(int fd, iovec * parts, int count, std::string & why) {
    msghdr msg{};
    msg.msg_iov = parts;
    msg.msg_iovlen = (size_t) count;
    while (msg.msg_iovlen > 0) {
        const ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) {
                continue;
            }
            why = errno == EAGAIN || errno == EWOULDBLOCK ? "the peer read nothing within the deadline"
                                                          : std::strerror(errno);
            return false;
        }
        advance(msg, (size_t) sent);
    }
    return true;
}

bool write_frame(int fd, const std::string & body, std::string & why) {
    char head[4];
    frame_head((uint32_t) body.size(), head);
    iovec parts[2] = {{head, sizeof head}, {const_cast<char *>(body.data()), body.size()}};
    return send_all(fd, parts, 2, why);
}

}  // namespace dgr
