// dgr-argmax-probe: the worker's greedy pick (src/argmax.cpp, what a ring's last stage and the MTP
// drafter choose with) on rows given on stdin, so a test can hold it to numpy.argmax.
//
//   dgr-argmax-probe N < rows.f32
//
// stdin: rows of N little-endian float32 values, back to back; stdout: one index per row.
#include "argmax.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    const long n = argc == 2 ? std::strtol(argv[1], nullptr, 10) : 0;
    if (n <= 0) {
        std::fprintf(stderr, "usage: dgr-argmax-probe N < rows (N float32 values per row)\n");
        return 2;
    }
    std::vector<float> row((size_t) n);
    while (std::fread(row.data(), sizeof(float), row.size(), stdin) == row.size()) {
        std::printf("%d\n", dgr::greedy_token(row.data(), n));
    }
    return 0;
}
