// Placeholder entry point while the worker is being written; the real one replaces this file.
#include <cstdio>
int main() {
    std::fprintf(stderr, "dgr-shard-worker: not implemented yet\n");
    return 6;
}
