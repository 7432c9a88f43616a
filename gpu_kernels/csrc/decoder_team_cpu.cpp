// A few-row decode step as one team of threads (run_team): every layer in one OpenMP region, the threads
// meeting at a TeamBarrier between the stages. decoder_layer_cpu.cpp runs it where team_runs says so.
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

#include "decoder_layer_parts.h"
#include "linear_quant_cpu.h"
#include "ops_cpu.h"
#include "team_barrier.h"

namespace batchtop_cpu::layer {
namespace {

constexpr int64_t TEAM_ROWS = 8;  // the most rows a step runs as one team

// The team's size: torch's threads, but no more than the CPUs this process may run on. Past those a thread
// only waits at each barrier for one that has no CPU (taskset -c 0 with 2 threads: 5-7x one thread's
// step time); a team of one runs the same stages with no barrier to wait at, the same bits.
int team_threads(int threads) {
#if defined(__linux__)
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) return std::max(1, std::min(threads, CPU_COUNT(&cpus)));
#endif
  return threads;
}

// Whether a step runs as a team or on the calling thread alone (a team of one: the same stages, the same
// bits). Where other busy processes share the cores, a team thread waits at a barrier for one the scheduler
// took off its core, often for a whole time slice: with a busy loop on each of 2 cores a SmolLM2 step at 2
// threads took up to 9x one thread's. A team step whose threads slept at the barriers for a tenth of its
// time starts a trial, a few steps alone, against the team's last three (never the first steps': a cold
// first step sleeps too); the faster goes on, unquestioned for a hold that doubles each time a trial
// confirms it. A lone thread is questioned at each hold's end: the cores may be free again.
class TeamChoice {
 public:
  // The threads the next step runs on: `team`, or 1
  int threads(int team) {
    std::lock_guard<std::mutex> lock(mutex_);
    return (trial_ > 0) != solo_ ? 1 : team;
  }

  // A step ran on `threads` threads in `seconds`, its threads sleeping `slept` seconds at the barriers
  void ran(int threads, double seconds, double slept) {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool alone = threads == 1;
    Times& mine = alone ? alone_ : team_;
    mine.add(seconds);
    ++step_;
    if (trial_ > 0 && alone != solo_) {
      if (--trial_ == 0) {
        if (mine.median() < (alone ? team_ : alone_).median()) {
          solo_ = alone;
          hold_ = kHold;
        } else {
          hold_ = std::min(2 * hold_, kMaxHold);
        }
        until_ = step_ + hold_;
      }
    } else if (trial_ == 0 && step_ >= until_ && (solo_ || (slept > kSlept * seconds && team_.n >= 3))) {
      trial_ = kTrial;
      (solo_ ? team_ : alone_) = Times{};
    }
  }

 private:
  struct Times {  // the last three
    double t[3] = {};
    int n = 0;
    void add(double s) { t[n++ % 3] = s; }
    double median() const {
      if (n < 3) return n == 0 ? 0 : n == 1 ? t[0] : std::min(t[0], t[1]);
      return std::max(std::min(t[0], t[1]), std::min(std::max(t[0], t[1]), t[2]));
    }
  };
  static constexpr int kTrial = 3;
  static constexpr int64_t kHold = 32, kMaxHold = 512;  // steps
  static constexpr double kSlept = 0.1;
  std::mutex mutex_;
  bool solo_ = false;  // the last trial's winner: a lone thread
  int trial_ = 0;      // steps left to run the other way
  int64_t step_ = 0, until_ = 0, hold_ = kHold;
  Times team_, alone_;
};

TeamChoice& team_choice() {
  static TeamChoice choice;
  return choice;
}

// A thread's share of one of the layer's linears (run_team): the columns it computed
ColumnShare linear_share(const bf16* x, int64_t x_stride, int64_t rows, int64_t k, const Packed& w, int64_t n,
                         bf16* out, int64_t out_stride, Epilogue epilogue, int64_t part, int64_t parts,
                         int64_t unit_cols = 16) {
  return linear_quant_share(quant_args(x, x_stride, rows, k, w, n, out, out_stride, epilogue), part, parts, unit_cols);
}

}  // namespace

// Whether run_team computes this step: a few rows (a decode step of a few sequences), every linear a
// pack linear_quant computes in shares, heads of whole pack groups (a qkv share is whole heads), and
// threads to share them. Anything else runs layer by layer.
bool team_runs(const std::vector<LayerWeights>& stack, int64_t rows, int64_t hidden, int64_t width, int64_t hd) {
#if defined(_OPENMP)
  if (rows > TEAM_ROWS || hd % 16 != 0 || at::get_num_threads() < 2 || at::in_parallel_region()) return false;
  for (const LayerWeights& w : stack)
    if (!linear_quant_shares(w.qkv.type, width, Epilogue::kStore) ||
        !linear_quant_shares(w.o.type, hidden, Epilogue::kAddInto) ||
        !linear_quant_shares(w.gate_up.type, 2 * gate_up_half(w.gate_up), Epilogue::kSiluMul) ||
        !linear_quant_shares(w.down.type, hidden, Epilogue::kAddInto))
      return false;
  return true;
#else
  return false;
#endif
}

// Every layer of a few-row step in one parallel region: the threads meet at a barrier between stages
// where each GEMM and the attention would otherwise start and join a region of their own (1-2 us each,
// 5 a layer); the attention splits each row's keys between the threads (paged_attention_team) where
// run_layer's gives each thread whole (row, KV head) jobs, 2:1 for SmolLM2's 3 KV heads on 2 threads.
// Each thread norms the rows for itself and quantizes them for its share of each linear. A qkv share is
// whole heads, which its thread ropes and writes to the pool before the barrier: no stage of its own.
// The barriers are TeamBarrier's (team_barrier.h), not libgomp's. Every output element is computed by
// the same operations as in run_layer: the same bits.
void run_team(bf16* xp, const std::vector<LayerWeights>& stack, at::TensorList k_caches, at::TensorList v_caches,
              const StepRows& s, Scratch& scratch) {
#if defined(_OPENMP)
  const int64_t rows = s.rows, hidden = s.hidden, kv_heads = k_caches[0].size(2), hd = k_caches[0].size(3);
  const int64_t q_dim = s.num_heads * hd, width = q_dim + 2 * kv_heads * hd, inter = gate_up_half(stack[0].gate_up);
  bf16* qkv_out = scratch.qkv.data_ptr<bf16>();
  bf16* attn = scratch.attn.data_ptr<bf16>();
  bf16* act = scratch.act.data_ptr<bf16>();
  const at::Tensor q = scratch.qkv.narrow(1, 0, q_dim).view({rows, s.num_heads, hd});
  const int64_t score_floats = paged_attention_team_scores(q, k_caches[0], s.context_lens);
  std::vector<float> scores(std::max<int64_t>(score_floats, 0));
  float* shared_scores = score_floats >= 0 ? scores.data() : nullptr;
  TeamBarrier barrier;
  const int team = team_threads(at::get_num_threads());
  const int threads = team > 1 ? team_choice().threads(team) : 1;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  {
    const int64_t part = omp_get_thread_num(), parts = omp_get_num_threads();
    const auto meet = [&] { barrier.wait(static_cast<int>(parts)); };
    std::vector<bf16> own(rows * hidden);  // this thread's normed rows
    for (size_t i = 0; i < stack.size(); ++i) {
      const LayerWeights& w = stack[i];
      {
        RECORD_USER_SCOPE("fused.qkv_proj");  // recorded on the thread that holds the profiler: thread 0
        norm_rows(own.data(), xp, w.input_norm, rows, hidden, s.eps);
        const ColumnShare mine =  // whole heads: roped here
            linear_share(own.data(), hidden, rows, hidden, w.qkv, width, qkv_out, width, Epilogue::kStore, part, parts, hd);
        rope_and_store(qkv_out, rows, width, s.num_heads, kv_heads, hd, s.cos, s.sin, s.table_rows,
                       k_caches[i].data_ptr<bf16>(), v_caches[i].data_ptr<bf16>(), s.slots, mine.begin / hd, mine.end / hd);
        meet();
      }
      {
        RECORD_USER_SCOPE("fused.attention");
        paged_attention_team(scratch.attn, q, k_caches[i], v_caches[i], s.block_tables, s.row_tables, s.context_lens,
                             s.scale, part, parts, shared_scores, barrier);
        meet();
      }
      {
        RECORD_USER_SCOPE("fused.o_proj_residual");
        linear_share(attn, q_dim, rows, q_dim, w.o, hidden, xp, hidden, Epilogue::kAddInto, part, parts);
        meet();
      }
      {
        RECORD_USER_SCOPE("fused.gate_up_silu");
        norm_rows(own.data(), xp, w.post_norm, rows, hidden, s.eps);
        linear_share(own.data(), hidden, rows, hidden, w.gate_up, 2 * inter, act, inter, Epilogue::kSiluMul, part, parts);
        meet();
      }
      {
        RECORD_USER_SCOPE("fused.down_proj_residual");
        linear_share(act, inter, rows, inter, w.down, hidden, xp, hidden, Epilogue::kAddInto, part, parts);
        meet();
      }
    }
  }
  if (team > 1)
    team_choice().ran(threads, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                      1e-9 * static_cast<double>(barrier.slept_ns()));
#endif
}

}  // namespace batchtop_cpu::layer
