// What the CPU kernels take from oneDNN, for the callers that name it: the run header,
// config.json and `bench peak` report the ISA, and the tests pick the bf16 backend. ops.h
// stays free of these so that another backend can implement it without oneDNN.
#pragma once

namespace meshtrain::kernels {

// How bf16 GEMMs run on this machine, decided once at first use from oneDNN's effective ISA
// (the CPU's, capped by ONEDNN_MAX_CPU_ISA): kOneDnn where it includes AVX512_BF16 or AMX and
// a bf16 matmul primitive can be created, else kWidenedFp32.
enum class Bf16Backend { kOneDnn, kWidenedFp32 };
Bf16Backend bf16_backend();
// Tests only: run bf16 GEMMs on `b` from now on (kOneDnn only where bf16_backend() chose it).
void force_bf16_backend(Bf16Backend b);
// oneDNN's effective ISA, e.g. "avx2", "avx512_core_amx".
const char* onednn_isa_name();

}  // namespace meshtrain::kernels
