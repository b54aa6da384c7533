#include "tls.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dgr {

static std::string read_pem(const std::string & dir, const char * name) {
    const std::string path = dir + "/" + name;
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) {
        throw std::runtime_error("--tls " + dir + ": cannot read " + name + " (`dgr tls` makes the folder)");
    }
    return text.str();
}

TlsFiles read_tls_dir(const std::string & dir) {
    return TlsFiles{read_pem(dir, "cert.pem"), read_pem(dir, "key.pem"), read_pem(dir, "ca.pem")};
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsFiles & files) {
    grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    options.pem_root_certs = files.ca;
    options.pem_key_cert_pairs.push_back({files.key, files.cert});
    return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsFiles & files) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = files.ca;
    options.pem_private_key = files.key;
    options.pem_cert_chain = files.cert;
    return grpc::SslCredentials(options);
}

}  // namespace dgr
