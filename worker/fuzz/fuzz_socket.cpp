#include "fuzz_socket.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace dgr::fuzz {

int bytes_on_socket(const uint8_t * data, size_t size, int & writer) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        std::abort();  // the harness, not the input: stop rather than fuzz nothing
    }
    const int buffer = 4 * (int) kLongestInput;
    setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    for (size_t at = 0; at < size;) {
        const ssize_t put = send(fds[0], data + at, size - at, MSG_NOSIGNAL);
        if (put <= 0) {
            std::abort();
        }
        at += (size_t) put;
    }
    shutdown(fds[0], SHUT_WR);
    writer = fds[0];
    return fds[1];
}

void close_pair(int reader, int writer) {
    close(reader);
    close(writer);
}

}  // namespace dgr::fuzz
