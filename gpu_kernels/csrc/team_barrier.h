// The barrier a team of threads meets at between the stages of a step (run_team: six times a layer).
// libgomp's `omp barrier` ends every meeting with a futex_wake system call by the last thread to arrive,
// whether or not anyone sleeps: ~0.8 us a meeting on a 2-core VM, 5 us of a SmolLM2 layer. Here the last
// thread only bumps a generation counter the others spin on. A thread that waits long (a core taken by
// another process) yields its core between looks, so an oversubscribed host still makes progress.
#pragma once

#include <atomic>
#include <thread>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace batchtop_cpu {

class TeamBarrier {
 public:
  // Every one of the region's `threads` threads calls wait(threads) in turn; none leaves before all came.
  void wait(int threads) {
    const unsigned seen = generation_.load(std::memory_order_acquire);  // before arriving: this meeting's
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads) {
      arrived_.store(0, std::memory_order_relaxed);  // before the release below: no one arrives earlier
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int looks = 0; generation_.load(std::memory_order_acquire) == seen; ++looks) {
      if (looks < kSpinLooks) {
#if defined(__x86_64__)
        _mm_pause();
#endif
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  static constexpr int kSpinLooks = 1 << 14;  // ~0.3 ms of pauses before yielding
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<unsigned> generation_{0};
};

}  // namespace batchtop_cpu
