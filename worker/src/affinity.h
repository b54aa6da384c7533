// --cpus: which CPUs a worker's threads may run on.
//
// Why: a stage hands each pass to the next one, so on a host that runs several stages the wake-up of
// the next stage is on every token's critical path. Measured on a 2-core VM (tiny-llama, one thread
// per worker, a ring of 4 stages): the stages free to move gave 0.77x the monolithic worker, the same
// stages all on one core 0.89x; a wake-up that crosses cores costs more there than the switch itself.
// Where stages share a host, the operator chooses their cores (or NUMA nodes) as with taskset or
// numactl, but from the worker's own command line, so the certificate's argv records it.
#pragma once

#include <string>
#include <vector>

namespace dgr {

// "0-3,8" -> {0, 1, 2, 3, 8}: comma-separated CPU ids or ascending ranges A-B, as Linux writes a CPU
// list. Throws UsageError naming --cpus for anything else (ids from 0 to 1023).
std::vector<int> parse_cpu_list(const std::string & text);

// Restricts the calling thread, and so every thread it starts after this, to ``cpus``; call it before
// any other thread exists. Returns "" or why it could not (the CPUs this process may use named).
std::string pin_process(const std::vector<int> & cpus);

// Lets the calling thread run wherever the process could before pin_process (a no-op when it never
// pinned): for a thread that only talks to the driver, so that traffic leaves the pinned CPUs free.
void unpin_this_thread();

}  // namespace dgr
