// Mutual TLS on the worker's gRPC port and on the channels it opens to its neighbours (issue 43).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

namespace dgr {

// The three PEM files of a --tls DIR (the layout `dgr tls` writes): this end's certificate and key, and
// the CA every peer's certificate must chain to.
struct TlsFiles {
    std::string cert;
    std::string key;
    std::string ca;
};

// Reads DIR/cert.pem, DIR/key.pem and DIR/ca.pem; throws std::runtime_error naming a missing or empty one.
TlsFiles read_tls_dir(const std::string & dir);

// Server side: a client without a certificate chaining to the CA fails the handshake, before any call.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsFiles & files);

// Client side (chained passes, deliveries): the peer must chain to the CA; this end presents its own.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsFiles & files);

}  // namespace dgr
