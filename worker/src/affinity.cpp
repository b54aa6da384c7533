#include "affinity.h"

#include "usage_error.h"

#include <cerrno>
#include <cstring>

#ifdef __linux__
#include <sched.h>
#endif

namespace dgr {

namespace {
constexpr int kMaxCpus = 1024;  // CPU_SETSIZE on Linux

int parse_cpu_id(const std::string & item, const std::string & text) {
    if (item.empty() || item.size() > 4 || item.find_first_not_of("0123456789") != std::string::npos) {
        throw UsageError("--cpus: expected a CPU list such as 0-3,8, got '" + text + "'");
    }
    const int id = std::stoi(item);
    if (id >= kMaxCpus) {
        throw UsageError("--cpus: CPU " + item + " is past the last one a CPU list may name (" +
                         std::to_string(kMaxCpus - 1) + ")");
    }
    return id;
}
}  // namespace

std::vector<int> parse_cpu_list(const std::string & text) {
    std::vector<int> cpus;
    size_t start = 0;
    for (;;) {
        const size_t comma = text.find(',', start);
        const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const size_t dash = item.find('-');
        const int first = parse_cpu_id(item.substr(0, dash), text);
        const int last = dash == std::string::npos ? first : parse_cpu_id(item.substr(dash + 1), text);
        if (last < first) {
            throw UsageError("--cpus: range '" + item + "' runs backwards");
        }
        for (int id = first; id <= last; ++id) {
            cpus.push_back(id);
        }
        if (comma == std::string::npos) {
            return cpus;
        }
        start = comma + 1;
    }
}

#ifdef __linux__
namespace {
cpu_set_t g_before_pinning;  // the mask pin_process replaced, written once before any other thread
bool g_pinned = false;

// "0-1,4": a CPU set as a CPU list (for the error message).
std::string cpu_list_text(const cpu_set_t & set) {
    std::string out;
    for (int id = 0; id < kMaxCpus; ++id) {
        if (!CPU_ISSET(id, &set) || (id > 0 && CPU_ISSET(id - 1, &set))) {
            continue;  // not a range's start
        }
        int last = id;
        while (last + 1 < kMaxCpus && CPU_ISSET(last + 1, &set)) {
            ++last;
        }
        out += (out.empty() ? "" : ",") + std::to_string(id) + (last > id ? "-" + std::to_string(last) : "");
    }
    return out;
}
}  // namespace

std::string pin_process(const std::vector<int> & cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int id : cpus) {
        CPU_SET(id, &set);
    }
    cpu_set_t before;
    CPU_ZERO(&before);
    sched_getaffinity(0, sizeof before, &before);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        return std::string(std::strerror(errno)) + " (this process may use CPUs " + cpu_list_text(before) + ")";
    }
    // the kernel drops CPUs that are absent or outside the cgroup's set without a word: refuse those
    cpu_set_t now;
    CPU_ZERO(&now);
    if (sched_getaffinity(0, sizeof now, &now) != 0 || !CPU_EQUAL(&now, &set)) {
        cpu_set_t missing;
        CPU_XOR(&missing, &set, &now);
        return "CPU " + cpu_list_text(missing) + " cannot be used here (this process may use CPUs " +
               cpu_list_text(before) + ")";
    }
    g_before_pinning = before;
    g_pinned = true;
    return "";
}

void unpin_this_thread() {
    if (g_pinned) {
        sched_setaffinity(0, sizeof g_before_pinning, &g_before_pinning);
    }
}
#else
std::string pin_process(const std::vector<int> &) {
    return "CPU affinity is set on Linux only";
}

void unpin_this_thread() {}
#endif

}  // namespace dgr
