// The error a malformed command line raises (main prints it with the usage text and exits 2). Its own
// header so that every parser of an argument throws it without depending on the whole command line:
// options.cpp calls affinity's CPU-list parser, and affinity needs only this.
#pragma once

#include <stdexcept>

namespace dgr {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace dgr
