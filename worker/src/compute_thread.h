// One thread that runs every graph a stage computes, where ggml computes with several threads.
//
// Why: the CPU backend runs a graph on an OpenMP team, and libgomp keeps one team (a thread pool) per
// thread that calls it. gRPC hands Forward calls to whichever of its threads is free, and a ring stage
// computes on the thread that reads its pass connection, so a worker at --threads N grows a team of
// N - 1 threads for every thread that ever decoded. Once libgomp manages more threads than there are
// CPUs, it stops spinning at a barrier and sleeps on a futex instead (its "throttled" spin count), and
// a graph has a barrier after almost every node: a decode of tiny-llama at 2 threads on the 2-core VM
// took 8.05 ms against 1.46 ms once a second thread that had decoded lived on (worker/README.md,
// "Threads"). Handing every compute to one thread keeps one team, so barriers spin as in llama-bench.
//
// At one thread ggml starts no team, and a hand-off would only add two wake-ups per call: the stage
// then computes on the caller's thread (ComputeThread::inline_for).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>

namespace dgr {

class ComputeThread {
public:
    ComputeThread();   // starts the thread, named dgr-compute (its OpenMP team inherits the name)
    ~ComputeThread();  // runs what is queued, then joins
    ComputeThread(const ComputeThread &) = delete;
    ComputeThread & operator=(const ComputeThread &) = delete;

    // True where ggml computes on the calling thread alone, so no compute thread is needed.
    static bool inline_for(int n_threads) { return n_threads <= 1; }

    // Runs fn on the compute thread and waits for it; its result or exception comes back to the caller.
    template <class Fn>
    auto run(Fn && fn) -> std::invoke_result_t<Fn &> {
        std::packaged_task<std::invoke_result_t<Fn &>()> task(std::ref(fn));
        auto result = task.get_future();
        submit([&task] { task(); });
        return result.get();
    }

private:
    void submit(std::function<void()> job);
    void loop();

    std::mutex mu_;
    std::condition_variable wake_;
    std::deque<std::function<void()>> jobs_;
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace dgr
