// The bf16 GEMM of linear_bf16_cpu.cpp as a C++ call, for the kernels that run a whole decoder layer.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace batchtop_cpu {

enum class Epilogue : int64_t {
  kStore = 0,    // out = x W^T + b
  kSiluMul = 1,  // out = silu(gate) * up, gate and up the two halves of x W^T + b (a weight packed by halves)
  kAddInto = 2,  // out += x W^T + b (the residual add), rounded as the two torch ops round
};

struct LinearArgs {
  const c10::BFloat16* x;  // (rows, 2 * pairs), rows x_stride apart
  int64_t x_stride, rows;
  const c10::BFloat16* packed;  // pack_linear_bf16's (groups, pairs, 64, 2)
  int64_t groups, pairs;
  int64_t n;     // output features: the weight's N (the bias's length)
  int64_t half;  // > 0: packed with its halves interleaved (cpu_kernels.interleave_halves), each half long
  const c10::BFloat16* bias;  // (n,) or null
  c10::BFloat16* out;         // rows out_stride apart
  int64_t out_stride;
  Epilogue epilogue;
};

void linear_bf16_run(const LinearArgs& args);  // splits the columns across torch's intra-op threads

}  // namespace batchtop_cpu
