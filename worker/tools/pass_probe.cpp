// dgr-pass-probe: a hostile client of a pass port in authenticated frames (issue 43), so a test can hold
// a real worker to refusing what an attacker on the path could send: a frame replayed on its own
// connection, a frame altered after it was tagged, and two frames in the wrong order.
//
//   dgr-pass-probe --tls DIR --port N --frame FILE --then replay|tamper|reorder|none
//
// Dials 127.0.0.1:N as a stage of the CA in DIR (cert.pem, key.pem, ca.pem) would, asking for
// authenticated frames (mac_frames.h), and exits 3 if the worker does not choose them. FILE is a frame's
// body (a serialized ForwardRequest). The frames' bytes on the wire are made by a twin of the
// connection's own frames, keyed from the same TLS session, writing into a socket pair:
//   none:    FILE once, as the connection sends it (sequence 0);
//   replay:  FILE once, then the same bytes again (the worker expects sequence 1 there);
//   tamper:  FILE once with one byte of its body changed after tagging;
//   reorder: FILE twice (sequence 0 and 1), the second sent first.
// Then reads until the worker closes the connection or 5 s pass, and prints "closed" or "open".
// Exit 2 on bad usage, 1 when the connection or the twin fails.
#include "mac_frames.h"
#include "secure_link.h"
#include "sockets.h"
#include "tls.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace {

struct Options {
    std::string tls_dir, frame_path, then;
    int port = 0;
};

[[noreturn]] void fail(int code, const std::string & why) {
    std::fprintf(stderr, "dgr-pass-probe: %s\n", why.c_str());
    std::exit(code);
}

Options parse(int argc, char ** argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--tls") {
            o.tls_dir = v;
        } else if (a == "--port") {
            o.port = std::atoi(v.c_str());
        } else if (a == "--frame") {
            o.frame_path = v;
        } else if (a == "--then") {
            o.then = v;
        } else {
            fail(2, "unknown option " + a);
        }
    }
    const bool known = o.then == "replay" || o.then == "tamper" || o.then == "reorder" || o.then == "none";
    if (o.tls_dir.empty() || o.frame_path.empty() || o.port <= 0 || o.port > 65535 || !known) {
        fail(2, "usage: dgr-pass-probe --tls DIR --port N --frame FILE --then replay|tamper|reorder|none");
    }
    return o;
}

// The bytes ``frames`` of ``body`` take on the wire, as the connection ``ssl`` would send them.
std::string wire_bytes(SSL * ssl, const std::string & body, int frames) {
    int pair[2];
    std::string why, out;
    dgr::MacFrames twin;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0 || !twin.key(ssl, false, why)) {
        fail(1, "the twin: " + why);
    }
    for (int k = 0; k < frames; ++k) {
        if (!twin.write_frame(pair[0], body, why)) {
            fail(1, "the twin: " + why);
        }
    }
    close(pair[0]);
    char buf[1 << 16];
    for (ssize_t got; (got = read(pair[1], buf, sizeof buf)) > 0;) {
        out.append(buf, (size_t) got);
    }
    close(pair[1]);
    return out;
}

// The frames ``then`` asks for, in the order they go.
std::string hostile_bytes(SSL * ssl, const std::string & body, const std::string & then) {
    if (then == "reorder") {
        const std::string both = wire_bytes(ssl, body, 2);
        const size_t one = both.size() / 2;
        return both.substr(one) + both.substr(0, one);
    }
    std::string bytes = wire_bytes(ssl, body, 1);
    if (then == "replay") {
        bytes += bytes;
    } else if (then == "tamper" && bytes.size() > 4) {
        bytes[4] = (char) (bytes[4] ^ 0x01);  // the body's first byte, after the 4-byte head
    }
    return bytes;
}

}  // namespace

int main(int argc, char ** argv) {
    const Options o = parse(argc, argv);
    std::signal(SIGPIPE, SIG_IGN);
    std::ifstream in(o.frame_path, std::ios::binary);
    const std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const dgr::TlsContexts contexts(dgr::read_tls_dir(o.tls_dir), true);
    std::string why;
    const int fd = dgr::connect_tcp("127.0.0.1", o.port, std::chrono::milliseconds(10000), why);
    dgr::Link link(fd);
    if (fd < 0 || !link.connect_tls(contexts.dialing_pass(), "127.0.0.1", std::chrono::milliseconds(10000), why)) {
        fail(1, "connect: " + why);
    }
    if (!link.mac_frames()) {
        fail(3, "the worker chose TLS records, not authenticated frames");
    }
    const std::string bytes = hostile_bytes(link.session(), body, o.then);
    iovec all[1] = {{const_cast<char *>(bytes.data()), bytes.size()}};
    if (!dgr::send_all(fd, all, 1, why)) {
        fail(1, "send: " + why);
    }
    timeval limit{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    char byte;
    const ssize_t got = recv(fd, &byte, 1, 0);  // the worker never writes here: data or EOF means closed
    std::printf("%s\n", got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ? "closed" : "open");
    close(fd);
    return 0;
}
