// Where attention's operands sit in a fused qkv row of ld = C + 2*CK floats (ops.h,
// attention_forward): q (C = NH*hs columns, head h at h*hs), then k and v (CK = NKV*hs each);
// query head h reads key/value head h / group. Shared by the fp32 and bf16 kernels.
#pragma once
#include <cstddef>

namespace meshtrain::kernels {

struct QkvLayout {
  int hs, C, CK, ld, group;
  QkvLayout(int C_, int NH, int NKV)
      : hs(C_ / NH), C(C_), CK(NKV * (C_ / NH)), ld(C_ + 2 * NKV * (C_ / NH)), group(NH / NKV) {}
  size_t q(int b, int h, int T) const { return (size_t)b * T * ld + (size_t)h * hs; }
  size_t k_of_group(int b, int g, int T) const { return (size_t)b * T * ld + C + (size_t)g * hs; }
  size_t k(int b, int h, int T) const { return k_of_group(b, h / group, T); }
  size_t v(int b, int h, int T) const { return k(b, h, T) + CK; }
  size_t out(int b, int h, int T) const { return (size_t)b * T * C + (size_t)h * hs; }
};

}  // namespace meshtrain::kernels
