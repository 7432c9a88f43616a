// pack_linear_quant: a GGUF block matrix in the 16-column layout of quant_repack.h; quant_embedding: rows of
// a block matrix dequantized.
#include "quant_repack.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cstring>
#include <type_traits>

#include "linear_quant_cpu.h"

namespace batchtop_cpu {

namespace {
constexpr char MAGIC[8] = {'b', 't', 'q', '1', '6', 0, 0, 0};

int64_t file_block_bytes(int64_t qtype) { return quant_row_bytes(qtype, 32); }

// One group's record for block b: columns col[c] (null past N) of the file's rows.
void pack_record(int64_t qtype, const uint8_t* const* col, int64_t b, uint8_t* rec) {
  const int64_t fb = file_block_bytes(qtype);
  const bool min = qtype == 3, nib = qtype != 8;
  const int64_t head = min ? 64 : 32, q_at = min ? 4 : 2;
  std::memset(rec, 0, repack_record_bytes(qtype));
  for (int c = 0; c < 16; ++c) {
    if (col[c] == nullptr) continue;  // zero scales: the column adds nothing
    const uint8_t* blk = col[c] + b * fb;
    std::memcpy(rec + 2 * c, blk, 2);                // d
    if (min) std::memcpy(rec + 32 + 2 * c, blk + 2, 2);  // m
    for (int s = 0; s < (nib ? 4 : 8); ++s)
      for (int p = 0; p < 4; ++p) {
        const uint8_t v = blk[q_at + 4 * s + p];
        rec[head + 64 * s + 4 * c + p] = nib ? v : static_cast<uint8_t>(v ^ 0x80);
      }
  }
}
}  // namespace

bool quant_repacked(int64_t qtype) {
#if defined(BATCHTOP_QUANT_VNNI)
  return qtype == 2 || qtype == 3 || qtype == 8;
#else
  return false;
#endif
}

int64_t repack_record_bytes(int64_t qtype) {
  switch (qtype) {
    case 2: return 32 + 256;
    case 3: return 64 + 256;
    case 8: return 32 + 512;
    default: return 0;
  }
}

at::Tensor pack_linear_quant(const at::Tensor& blocks, int64_t qtype) {
  TORCH_CHECK(quant_row_bytes(qtype, 256) > 0, "pack_linear_quant: qtype ", qtype,
              " is not one of Q4_0 (2), Q4_1 (3), Q8_0 (8), Q4_K (12), Q6_K (14)");
  if (!quant_repacked(qtype)) return blocks;
  const int64_t fb = file_block_bytes(qtype);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.is_contiguous() &&
                  blocks.device().is_cpu() && blocks.size(1) > 0 && blocks.size(1) % fb == 0,
              "pack_linear_quant: blocks must be a contiguous (N, row_bytes) uint8 CPU tensor of ggml type ", qtype,
              " (", fb, " bytes a block), got ", blocks.sizes(), " ", blocks.scalar_type());
  const int64_t n = blocks.size(0), nblocks = blocks.size(1) / fb, k = 32 * nblocks;
  const int64_t groups = (n + 15) / 16, rec = repack_record_bytes(qtype), group_bytes = nblocks * rec;
  at::Tensor pack = at::empty({1 + groups, group_bytes}, blocks.options());
  uint8_t* p = pack.data_ptr<uint8_t>();
  std::memset(p, 0, group_bytes);
  RepackHeader h{};
  std::memcpy(h.magic, MAGIC, 8);
  h.qtype = qtype, h.n = n, h.k = k;
  std::memcpy(p, &h, sizeof h);
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  const int64_t row_bytes = blocks.size(1);
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const uint8_t* col[16];
      for (int c = 0; c < 16; ++c) col[c] = 16 * g + c < n ? src + (16 * g + c) * row_bytes : nullptr;
      for (int64_t b = 0; b < nblocks; ++b) pack_record(qtype, col, b, p + (1 + g) * group_bytes + b * rec);
    }
  });
  return pack;
}

const uint8_t* repacked_groups(const at::Tensor& pack, int64_t qtype, int64_t k, int64_t* n, const char* who) {
  const int64_t rec = repack_record_bytes(qtype);
  RepackHeader h{};
  const bool shaped = pack.dim() == 2 && pack.scalar_type() == at::kByte && pack.is_contiguous() &&
                      pack.device().is_cpu() && pack.size(0) >= 1 && pack.size(1) == k / 32 * rec && rec > 0;
  if (shaped) std::memcpy(&h, pack.data_ptr<uint8_t>(), sizeof h);
  TORCH_CHECK(shaped && std::memcmp(h.magic, MAGIC, 8) == 0 && h.qtype == qtype && h.k == k &&
                  pack.size(0) == 1 + (h.n + 15) / 16,
              who, ": the weight of ggml type ", qtype, " must be pack_linear_quant's pack of a (N, ", k / 32,
              " blocks) matrix for ", k, " features, got ", pack.sizes(), " ", pack.scalar_type(),
              " (pack the file's blocks with pack_linear_quant first)");
  *n = h.n;
  return pack.data_ptr<uint8_t>() + pack.size(1);
}

// out[i] = row ids[i] of the (N, row_bytes) block matrix of qtype (Q4_0, Q4_1, Q8_0; the file's layout),
// dequantized as core_engine/model/quant_blocks.py does: w = d * q (Q4_0: d * (q - 8); Q4_1: d * q + m) in
// fp32, then rounded to out's dtype. A step's token embeddings in one op, not a dozen torch ops.
void quant_embedding(at::Tensor& out, const at::Tensor& blocks, const at::Tensor& ids, int64_t qtype) {
  TORCH_CHECK(qtype == 2 || qtype == 3 || qtype == 8, "quant_embedding: qtype must be Q4_0 (2), Q4_1 (3) or Q8_0 (8), got ",
              qtype);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.device().is_cpu(),
              "quant_embedding: blocks must be a contiguous (N, row_bytes) uint8 CPU tensor");
  const int64_t fb = file_block_bytes(qtype), row_bytes = blocks.size(1), k = row_bytes / fb * 32;
  TORCH_CHECK(row_bytes % fb == 0, "quant_embedding: a row of ", row_bytes, " bytes is not whole blocks of ", fb);
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong && ids.is_contiguous(), "quant_embedding: ids must be (T,) int64");
  const int64_t n = ids.size(0);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == n && out.size(1) == k && out.is_contiguous() &&
                  (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat),
              "quant_embedding: out must be a contiguous (", n, ", ", k, ") bfloat16 or float32 tensor");
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < blocks.size(0), "quant_embedding: id ", id[i], " is outside [0, ", blocks.size(0), ")");
  const auto half = [](const uint8_t* p) {
    c10::Half h;
    std::memcpy(&h, p, 2);
    return static_cast<float>(h);
  };
  const auto run = [&](auto* o) {
    using T = std::remove_pointer_t<decltype(o)>;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* row = blocks.data_ptr<uint8_t>() + id[i] * row_bytes;
      T* dst = o + i * k;
      for (int64_t b = 0; b < k / 32; ++b, row += fb, dst += 32) {
        const float d = half(row);
        for (int j = 0; j < 32; ++j) {
          float w;
          if (qtype == 8) {
            w = static_cast<float>(static_cast<int8_t>(row[2 + j])) * d;
          } else {
            const uint8_t byte = row[(qtype == 3 ? 4 : 2) + j % 16];
            const int q = j < 16 ? byte & 0x0F : byte >> 4;
            w = qtype == 3 ? d * static_cast<float>(q) + half(row + 2) : d * static_cast<float>(q - 8);
          }
          dst[j] = static_cast<T>(w);
        }
      }
    }
  };
  if (out.scalar_type() == at::kFloat)
    run(out.data_ptr<float>());
  else
    run(out.data_ptr<c10::BFloat16>());
}

}  // namespace batchtop_cpu
