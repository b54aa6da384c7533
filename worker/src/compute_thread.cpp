#include "compute_thread.h"

#include <pthread.h>

namespace dgr {

ComputeThread::ComputeThread() : thread_([this] { loop(); }) {}

ComputeThread::~ComputeThread() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

void ComputeThread::submit(std::function<void()> job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
}

void ComputeThread::loop() {
#ifdef __linux__
    pthread_setname_np(pthread_self(), "dgr-compute");  // as ps, top and /proc name it
#endif
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) {
            return;  // stopping, and nothing left to run
        }
        std::function<void()> job = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        job();  // a packaged task: its exception goes to the caller's future
        lock.lock();
    }
}

}  // namespace dgr
