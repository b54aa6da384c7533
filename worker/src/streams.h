// A streamed ring's hops (Ring.stream): each pass crosses a seam as one length-prefixed message on a
// TCP connection kept open to the next stage's pass port, read by a thread blocked on that socket.
//
// Why not gRPC for this hop: a gRPC message costs two thread hand-offs on each side (the poller thread
// reads the socket, then wakes the thread waiting on the call) plus HTTP/2 framing; measured on the
// 2-core box under load, a gRPC stream message took 0.27-0.29 ms one way against a 0.01 ms TCP floor.
// Here the sender writes once (writev, TCP_NODELAY) and the receiving stage's own thread wakes in
// recv, parses the ForwardRequest and computes: one wake-up per crossing. Everything else (Info, the
// first pass, prefill, relayed and chained passes, deliveries to the driver) stays on gRPC.
//
// Wire: a 4-byte little-endian length, then a serialized dgr.shard.v1.ForwardRequest; a message
// larger than the model's message_limit, or one that does not parse, closes the connection. The pass
// port of a stage is found through its Info (InfoReply.pass_port): a worker dials only the pass port
// that a stage it may call (--peers) named, on that stage's host.
//
// One connection per neighbour, not per session: a stage computes one batch at a time (Stage's
// mutex), so more connections would add no parallelism; a session's passes stay in order on it.
// Writers to one connection take turns. A connection that fails is closed and the next pass opens a
// new one.
//
// With --tls every connection is mutual TLS (secure_link.h): a peer without a certificate of the
// worker's CA fails the handshake and is closed before any byte reaches the stage. At most
// --max-pass-connections are held at once, each with its reader thread; one more evicts the oldest
// connection not yet proven (its TLS handshake, or without TLS its first whole pass, still to come) or,
// where every one is proven, is closed at once: a flood of connections costs no thread beyond the
// limit and cannot keep a neighbour that proves itself out.
#pragma once

#include "chain.h"
#include "secure_link.h"
#include "shard.pb.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace dgr {

class PassStreams {
public:
    // the pass is the read loop's own message, reused for the next read: the handler may consume it
    using OnPass = std::function<void(dgr::shard::v1::ForwardRequest &, int64_t received_ns)>;

    PassStreams(Chain & chain, int max_message_bytes) : chain_(chain), max_bytes_(max_message_bytes) {}
    ~PassStreams();
    PassStreams(const PassStreams &) = delete;
    PassStreams & operator=(const PassStreams &) = delete;

    // Listen on ``host`` (``port``: 0 for any free one); every pass read is handed to ``on_pass`` on the
    // connection's own thread. Returns the port. Throws std::runtime_error when it cannot listen.
    int listen(const std::string & host, int port, OnPass on_pass);
    int port() const { return port_; }

    // --record-passes: each pass read is also written, as the frame's body (a serialized ForwardRequest),
    // to a file of its own under ``dir`` (pass-PID-N.bin, the first kRecordedPasses): real passes for the
    // fuzz targets' corpus (worker/fuzz). Call before listen.
    void record_to(const std::string & dir) { record_dir_ = dir; }
    static constexpr int kRecordedPasses = 256;

    // Send ``pass`` to the stage whose gRPC address is ``address``, connecting to its pass port first if
    // needed. Not OK when the pass could not be handed over (the connection is then closed).
    ChainResult send(const std::string & address, const dgr::shard::v1::ForwardRequest & pass);

    // The worker is stopping: close every connection both ways and the listener (a neighbour's next
    // pass then fails and names us).
    void stop();

private:
    struct Out;

    struct In {
        uint64_t order = 0;   // accepted as the order-th connection
        bool proven = false;  // handshake done (TLS) or a whole pass read (plain)
    };

    int pass_port_of(const std::string & address, std::string & why);  // -1 and why when it has none
    bool connect_to(const std::string & address, Out & out, std::string & why);
    void accept_loop();
    // mu_ held (``lock``): room for fd, evicting an unproven connection where needed and waiting for its
    // reader to end
    bool admit(std::unique_lock<std::mutex> & lock, int fd);
    void read_loop(int fd);
    void read_passes(int fd, Link & link);
    void record(const std::string & body);

    Chain & chain_;
    const int max_bytes_;
    OnPass on_pass_;
    int listen_fd_ = -1;
    int port_ = 0;
    std::atomic<bool> stopping_{false};
    std::mutex mu_;
    std::map<std::string, std::shared_ptr<Out>> out_;
    std::map<int, In> in_;          // accepted connections still read
    std::condition_variable gone_;  // a reader ended (read_loop), its connection out of in_
    uint64_t accepted_ = 0;
    uint64_t refused_ = 0;    // connections closed at once: the limit reached, every one proven
    std::string record_dir_;  // --record-passes; "": none
    std::atomic<int> recorded_{0};
};

}  // namespace dgr
