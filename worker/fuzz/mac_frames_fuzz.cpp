// libFuzzer target: bytes arriving on a pass port connection that runs authenticated frames
// (src/mac_frames.h), read as PassStreams::read_passes reads them: frames off a socket by
// MacFrames::read_frame under a message limit, the receiving side keyed with fixed keys, each whole
// frame parsed as a ForwardRequest and, if a streamed pass, checked against every stage shape. What an
// attacker on the path controls is everything before a tag checks: the head, the chunk lengths it
// implies, short frames, and tags. The seeds (tests/fuzz/native.py) are recorded passes framed and
// tagged under the same keys, so the checked path is reached too. Written whole into one end of a
// socket pair and that end shut, as pass_port_fuzz.cpp does.
#include "fuzz_socket.h"
#include "fuzz_stages.h"
#include "mac_frames.h"
#include "request_args.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

static constexpr int64_t kMessageLimit = 16384;

// tests/fuzz/native.py tags the seeds with these: the dialing stage sends under kSendKey.
static const unsigned char kSendKey[dgr::MacKey::kKeyBytes] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                                               12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                                               23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const unsigned char kOtherKey[dgr::MacKey::kKeyBytes] = {0};

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size > dgr::fuzz::kLongestInput) {
        return 0;
    }
    int writer = -1;
    const int reader = dgr::fuzz::bytes_on_socket(data, size, writer);

    dgr::MacFrames frames;
    if (!frames.set_keys(kOtherKey, kSendKey)) {
        std::abort();
    }
    dgr::shard::v1::ForwardRequest pass;
    std::string body;
    uint32_t announced = 0;
    while (frames.read_frame(reader, kMessageLimit, body, announced) == dgr::FrameRead::Whole) {
        if (!pass.ParseFromString(body)) {
            break;
        }
        if (dgr::is_streamed_pass(pass)) {
            dgr::fuzz::check_on_every_stage(pass);
        }
    }
    dgr::fuzz::close_pair(reader, writer);
    return 0;
}
