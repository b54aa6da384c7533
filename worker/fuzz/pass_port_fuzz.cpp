// libFuzzer target: bytes arriving on a pass port connection, read as PassStreams::read_loop reads them
// (streams.cpp): frames off a socket by read_frame under a message limit, each parsed as a
// ForwardRequest; one that is not a streamed pass is dropped, as the service drops it, and a streamed
// one is checked against every stage shape. The input is written whole into one end of a socket pair
// and that end shut, so the reader meets a short frame as the end of a connection, as it would.
#include "fuzz_socket.h"
#include "fuzz_stages.h"
#include "request_args.h"
#include "sockets.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

// Below the inputs' longest (nox -s fuzz passes -max_len=65536), so frames over the limit are read too.
static constexpr int64_t kMessageLimit = 16384;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size > dgr::fuzz::kLongestInput) {
        return 0;
    }
    int writer = -1;
    const int reader = dgr::fuzz::bytes_on_socket(data, size, writer);

    dgr::shard::v1::ForwardRequest pass;
    std::string body;
    uint32_t announced = 0;
    while (dgr::read_frame(reader, kMessageLimit, body, announced) == dgr::FrameRead::Whole) {
        if (!pass.ParseFromString(body)) {
            break;  // the read loop closes the connection
        }
        if (dgr::is_streamed_pass(pass)) {
            dgr::fuzz::check_on_every_stage(pass);
        }
    }
    dgr::fuzz::close_pair(reader, writer);
    return 0;
}
