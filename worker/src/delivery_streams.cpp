#include "delivery_streams.h"

#include "options.h"
#include "sockets.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pb = dgr::shard::v1;

namespace dgr {

namespace {
// A refusal is a request id and a sentence; anything longer is not one.
constexpr uint32_t kMaxRefusalBytes = 64 * 1024;
}  // namespace

DeliveryStreams::~DeliveryStreams() {
    for (auto & [address, c] : connections_) {
        drop(c);
    }
}

void DeliveryStreams::drop(Connection & c) {
    if (c.fd >= 0) {
        close(c.fd);
    }
    c.fd = -1;
    c.unread.clear();
}

bool DeliveryStreams::read_refusals(Connection & c, std::vector<std::string> & refused, std::string & why) {
    char buf[4096];
    for (;;) {
        const ssize_t got = recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (got > 0) {
            c.unread.append(buf, (size_t) got);
            continue;
        }
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        }
        why = got == 0 ? "the driver closed its delivery stream"
                       : std::string("reading the delivery stream: ") + std::strerror(errno);
        return false;
    }
    size_t at = 0;
    while (c.unread.size() - at >= 4) {
        const uint32_t n = frame_length(c.unread.data() + at);
        pb::DeliveryRefused refusal;
        if (n > kMaxRefusalBytes) {
            why = "the driver sent a " + std::to_string(n) + "-byte frame, not a DeliveryRefused";
            return false;
        }
        if (c.unread.size() - at - 4 < n) {
            break;  // the rest comes later
        }
        if (!refusal.ParseFromArray(c.unread.data() + at + 4, (int) n)) {
            why = "the driver sent a frame that is not a DeliveryRefused";
            return false;
        }
        refused.push_back(refusal.request_id());
        std::fprintf(stderr, "dgr-shard-worker: ring %s: the driver refused its delivery: %s; the ring stops\n",
                     refusal.request_id().c_str(), refusal.reason().c_str());
        at += 4 + n;
    }
    c.unread.erase(0, at);
    return true;
}

bool DeliveryStreams::send(const std::string & address, const pb::Delivery & delivery,
                           std::chrono::milliseconds timeout, std::vector<std::string> & refused, std::string & why) {
    Connection & c = connections_[address];
    if (c.fd < 0) {
        std::string host, port;
        if (!split_host_port(address, host, port, false)) {
            why = "delivery_stream " + address + " is not HOST:PORT";
            return false;
        }
        c.fd = connect_tcp(host, std::atoi(port.c_str()), timeout, why);
        if (c.fd < 0) {
            why = "delivery stream: " + why;
            return false;
        }
        // a driver that stops reading fails the write at the ring's deadline instead of holding it
        timeval limit{(time_t) (timeout.count() / 1000), (suseconds_t) (timeout.count() % 1000 * 1000)};
        setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    }
    if (!delivery.SerializeToString(&body_)) {
        why = "a delivery that does not serialize";
        return false;
    }
    const bool sent = write_frame(c.fd, body_, why) && read_refusals(c, refused, why);
    if (body_.capacity() > kKeptFrameBytes) {
        std::string().swap(body_);
    }
    if (!sent) {
        drop(c);
    }
    return sent;
}

}  // namespace dgr
