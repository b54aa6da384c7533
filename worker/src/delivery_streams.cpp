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
    c.link.reset();
    if (c.fd >= 0) {
        close(c.fd);
    }
    c.fd = -1;
    c.unread.clear();
}

bool DeliveryStreams::read_refusals(Connection & c, std::vector<std::string> & refused, std::string & why) {
    if (!c.link->read_available(c.unread, why)) {
        why = "the delivery stream: " + why;
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

bool DeliveryStreams::connect(const std::string & address, Connection & c, std::chrono::milliseconds timeout,
                              std::string & why) {
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
    c.link = std::make_unique<Link>(c.fd);
    if (tls_ != nullptr && !c.link->connect_tls(tls_->dialing(), host, timeout, why)) {
        why = "delivery stream: " + why;
        return false;
    }
    // a driver that stops reading fails the write at the ring's deadline instead of holding it
    timeval limit{(time_t) (timeout.count() / 1000), (suseconds_t) (timeout.count() % 1000 * 1000)};
    setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    return true;
}

bool DeliveryStreams::send(const std::string & address, const pb::Delivery & delivery,
                           std::chrono::milliseconds timeout, std::vector<std::string> & refused, std::string & why) {
    Connection & c = connections_[address];
    if (c.fd < 0 && !connect(address, c, timeout, why)) {
        drop(c);
        return false;
    }
    if (!delivery.SerializeToString(&body_)) {
        why = "a delivery that does not serialize";
        return false;
    }
    const bool sent = c.link->write_frame(body_, why) && read_refusals(c, refused, why);
    if (body_.capacity() > kKeptFrameBytes) {
        std::string().swap(body_);
    }
    if (!sent) {
        drop(c);
    }
    return sent;
}

}  // namespace dgr
