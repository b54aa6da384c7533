// What the connection targets (pass_port, mac_frames) read from: the input written whole into one end
// of a socket pair and that end shut, so the reader meets a short frame as the end of a connection, as
// it would.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dgr::fuzz {

// Inputs longer than this are skipped: they fit the socket's buffer, set to 4 x this.
constexpr size_t kLongestInput = 1 << 18;

// The read end holding ``data``; ``writer`` gets the other end (both closed by close_pair).
int bytes_on_socket(const uint8_t * data, size_t size, int & writer);
void close_pair(int reader, int writer);

}  // namespace dgr::fuzz
