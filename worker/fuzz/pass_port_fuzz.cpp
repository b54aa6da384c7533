// libFuzzer target: bytes arriving on a pass port connection, read as PassStreams::read_loop reads them
// (streams.cpp): frames off a socket by read_frame under a message limit, each parsed as a
// ForwardRequest; one that is not a streamed pass is dropped, as the service drops it, and a streamed
// one is checked against every stage shape. The input is written whole into one end of a socket pair
// and that end shut, so the reader meets a short frame as the end of a connection, as it would.
#include "fuzz_stages.h"
#include "request_args.h"
#include "sockets.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

// Below the inputs' longest (nox -s fuzz passes -max_len=65536), so frames over the limit are read too.
static constexpr int64_t kMessageLimit = 16384;
static constexpr size_t kLongestInput = 1 << 18;  // fits the socket's buffer once it is set to 4 x this

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size > kLongestInput) {
        return 0;
    }
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

    dgr::shard::v1::ForwardRequest pass;
    std::string body;
    uint32_t announced = 0;
    while (dgr::read_frame(fds[1], kMessageLimit, body, announced) == dgr::FrameRead::Whole) {
        if (!pass.ParseFromString(body)) {
            break;  // the read loop closes the connection
        }
        if (dgr::is_streamed_pass(pass)) {
            dgr::fuzz::check_on_every_stage(pass);
        }
    }
    close(fds[0]);
    close(fds[1]);
    return 0;
}
