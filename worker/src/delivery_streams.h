// A streamed ring's deliveries as frames on a TCP connection to the driver (Ring.delivery_stream),
// instead of one Deliver call per token.
//
// Why: a gRPC call per token costs the worker's delivery thread and gRPC's own threads about 160 us of
// CPU, and the driver's Python gRPC server about 280 us more (stop 33's per-thread probe). On a host
// whose cores the stages share, that CPU is taken from the stages: a Python gRPC delivery per token
// cost dgr-ring-floor's 4- and 12-stage rings 16-18% of their speed, a raw one 0-5%
// (worker/README.md, "Ring decode"). A frame costs one serialization and one send here, and one read
// and one parse in the driver's reader thread.
//
// Wire: the frame of the pass ports (worker/src/sockets.h) carrying a serialized Delivery; the driver
// answers a delivery it does not take with a framed DeliveryRefused on the same connection, read here
// at the next send to it. Used by the ring's one delivery thread alone, so it takes no lock.
#pragma once

#include "secure_link.h"
#include "shard.pb.h"

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace dgr {

class DeliveryStreams {
public:
    // ``tls``: the worker's contexts (--tls): every connection is mutual TLS to the driver; null: plain
    explicit DeliveryStreams(const TlsContexts * tls = nullptr) : tls_(tls) {}
    ~DeliveryStreams();  // closes every connection
    DeliveryStreams(const DeliveryStreams &) = delete;
    DeliveryStreams & operator=(const DeliveryStreams &) = delete;

    // Send ``delivery`` to the delivery port at ``address`` (host:port), connecting first where there is
    // no connection; ``timeout`` bounds the connect and each write. ``refused`` gets every request id
    // the driver has refused on that connection since the last send. An error (the connection is then
    // closed) when the delivery could not be handed over or the driver closed the connection.
    bool send(const std::string & address, const dgr::shard::v1::Delivery & delivery, std::chrono::milliseconds timeout,
              std::vector<std::string> & refused, std::string & why);

private:
    struct Connection {
        int fd = -1;
        std::unique_ptr<Link> link;  // over fd: plain, or TLS
        std::string unread;          // bytes the driver sent that are not yet a whole frame
    };

    // Read what the driver has sent without waiting: refusals into ``refused``; false when it closed
    // the connection or sent something that is not a DeliveryRefused frame.
    static bool read_refusals(Connection & c, std::vector<std::string> & refused, std::string & why);
    void drop(Connection & c);

    bool connect(const std::string & address, Connection & c, std::chrono::milliseconds timeout, std::string & why);

    const TlsContexts * tls_;
    std::map<std::string, Connection> connections_;
    std::string body_;  // the last delivery sent, its capacity kept for the next
};

}  // namespace dgr
