// The barrier a team of threads meets at between the stages of a step (run_team: six times a layer).
// libgomp's `omp barrier` ends every meeting with a futex_wake system call by the last thread to arrive,
// whether or not anyone sleeps: ~0.8 us a meeting on a 2-core VM, 5 us of a SmolLM2 layer. Here the last
// thread only bumps a generation counter the others spin on, and calls futex_wake only where one sleeps.
//
// A waiter spins ~50 us (a quiet meeting waits under one), then sleeps on the counter (futex). It used to
// spin ~0.3 ms and then sched_yield: on a core shared with another busy process the spin spends the
// thread's share of the core and each yield hands the rest of its slice to that process, while the thread
// it waits for sits descheduled; at ~200 meetings a step, 2 threads took 7x one thread's step time.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
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
      // seq_cst here and in the sleeper's count and look below: either this load sees the sleeper, or the
      // sleeper's look (or futex_wait's own) sees the new generation
      generation_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) wake_all();
      return;
    }
    if (spin(seen)) return;
    const auto slept = std::chrono::steady_clock::now();
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (generation_.load(std::memory_order_seq_cst) == seen) sleep_while(seen);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    slept_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - slept)
                            .count(),
                        std::memory_order_relaxed);
  }

  // The nanoseconds the team's threads slept here, all together: their waits past the spin
  int64_t slept_ns() const { return slept_ns_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kFreeLooks = 256;  // pauses before the first look at the clock
  static constexpr std::chrono::microseconds kSpin{50};

  // Whether the meeting ended within kSpin
  bool spin(unsigned seen) const {
    std::chrono::steady_clock::time_point deadline{};
    for (int looks = 0;; ++looks) {
      if (generation_.load(std::memory_order_acquire) != seen) return true;
#if defined(__x86_64__)
      _mm_pause();
#endif
      if (looks == kFreeLooks) deadline = std::chrono::steady_clock::now() + kSpin;
      if (looks > kFreeLooks && looks % 64 == 0 && std::chrono::steady_clock::now() > deadline) return false;
    }
  }

#if defined(__linux__)
  static_assert(sizeof(std::atomic<unsigned>) == sizeof(int), "futex on the generation counter");
  int* word() { return reinterpret_cast<int*>(&generation_); }
  void sleep_while(unsigned seen) {  // returns at once when the counter moved (EAGAIN), or on any wake
    syscall(SYS_futex, word(), FUTEX_WAIT_PRIVATE, static_cast<int>(seen), nullptr, nullptr, 0);
  }
  void wake_all() { syscall(SYS_futex, word(), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0); }
#else
  void sleep_while(unsigned) { std::this_thread::yield(); }
  void wake_all() {}
#endif

  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<unsigned> generation_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<int64_t> slept_ns_{0};
};

}  // namespace batchtop_cpu
