// CUDA launches of the none, fp16 and bf16 codecs: one grid-stride pass,
// 16-byte loads and stores, over the element functions of kernels/cast.h and
// kernels/error_feedback.h (the same ones kernels/cast_cpu.cc loops over).
#include "kernels/cast.h"
#include "kernels/cuda_common.cuh"
#include "kernels/error_feedback.h"

namespace gz::kernels::cuda {
namespace {

using namespace detail;

// ---- element types -------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(kThreads)
    widen_kernel(const T* __restrict__ in, std::size_t n, float* __restrict__ out) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = to_float(in[i]);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    narrow_kernel(const float* __restrict__ in, std::size_t n, T* __restrict__ out, const std::uint32_t* gate) {
  if (gate_closed(gate)) return;
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) out[i] = from_float<T>(in[i]);
}

// ---- none ----------------------------------------------------------------

template <bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    copy_encode_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, float* __restrict__ out,
                       Blob32 head, bool vec) {
  store_blob(head);
  std::size_t tail = 0;
  if (vec) {  // 4 elements per step
    const std::size_t units = n / 4;
    for (std::size_t u = global_thread(); u < units; u += grid_threads()) {
      float4 v = reinterpret_cast<const float4*>(g)[u];
      if constexpr (kEf) {
        const float4 rv = reinterpret_cast<const float4*>(r)[u];
        v.x += rv.x, v.y += rv.y, v.z += rv.z, v.w += rv.w;
        reinterpret_cast<float4*>(r)[u] = make_float4(ef_residual(v.x, v.x), ef_residual(v.y, v.y),
                                                      ef_residual(v.z, v.z), ef_residual(v.w, v.w));
      }
      reinterpret_cast<float4*>(out)[u] = v;
    }
    tail = units * 4;
  }
  for (std::size_t i = tail + global_thread(); i < n; i += grid_threads()) {
    const float v = ef_input<kEf>(g, r, i);
    out[i] = v;
    if constexpr (kEf) r[i] = ef_residual(v, v);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    copy_decode_kernel(const float* __restrict__ in, std::size_t n, Out<T> out, Combine c, const std::uint32_t* gate,
                       bool vec) {
  decode_elements<4>(
      n, out, c, gate, vec,
      [&](std::size_t u, float* d) {
        const float4 a = reinterpret_cast<const float4*>(in)[u];
        d[0] = a.x, d[1] = a.y, d[2] = a.z, d[3] = a.w;
      },
      [&](std::size_t i) { return in[i]; });
}

// ---- fp16 / bf16 ------------------------------------------------------------

// 8 elements per step: two float4 of g (and r), one 16-byte store of payload.
template <class Fmt, bool kEf, class G>
__global__ void __launch_bounds__(kThreads)
    cast_encode_kernel(const G* __restrict__ g, float* __restrict__ r, std::size_t n, std::uint16_t* __restrict__ out,
                       Blob32 head, bool vec) {
  store_blob(head);
  std::size_t tail = 0;
  if (vec) {
    const std::size_t units = n / 8;
    for (std::size_t u = global_thread(); u < units; u += grid_threads()) {
      const float4* g4 = reinterpret_cast<const float4*>(g) + 2 * u;
      const float4 a = g4[0], b = g4[1];
      float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      if constexpr (kEf) {
        const float4* r4 = reinterpret_cast<const float4*>(r) + 2 * u;
        const float4 ra = r4[0], rb = r4[1];
        const float rv[8] = {ra.x, ra.y, ra.z, ra.w, rb.x, rb.y, rb.z, rb.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = v[e] + rv[e];
      }
      std::uint32_t h[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) h[e] = Fmt::encode(v[e]);
      reinterpret_cast<uint4*>(out)[u] =
          make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16), h[6] | (h[7] << 16));
      if constexpr (kEf) {
        float res[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) res[e] = ef_residual(v[e], Fmt::decode(static_cast<std::uint16_t>(h[e])));
        float4* r4 = reinterpret_cast<float4*>(r) + 2 * u;
        r4[0] = make_float4(res[0], res[1], res[2], res[3]);
        r4[1] = make_float4(res[4], res[5], res[6], res[7]);
      }
    }
    tail = units * 8;
  }
  for (std::size_t i = tail + global_thread(); i < n; i += grid_threads()) {
    const float v = ef_input<kEf>(g, r, i);
    const std::uint16_t h = Fmt::encode(v);
    out[i] = h;
    if constexpr (kEf) r[i] = ef_residual(v, Fmt::decode(h));
  }
}

template <class Fmt, class T>
__global__ void __launch_bounds__(kThreads)
    cast_decode_kernel(const std::uint16_t* __restrict__ in, std::size_t n, Out<T> out, Combine c,
                       const std::uint32_t* gate, bool vec) {
  decode_elements<8>(  // 8 elements per unit: one 16-byte load of payload
      n, out, c, gate, vec,
      [&](std::size_t u, float* d) {
        const uint4 p = reinterpret_cast<const uint4*>(in)[u];
        const std::uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          d[2 * k] = Fmt::decode(static_cast<std::uint16_t>(w[k] & 0xFFFFu));
          d[2 * k + 1] = Fmt::decode(static_cast<std::uint16_t>(w[k] >> 16));
        }
      },
      [&](std::size_t i) { return Fmt::decode(in[i]); });
}

}  // namespace

template <class T>
void widen(const T* in, std::size_t n, float* out, Stream stream) {
  if (n == 0) return;
  widen_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, n, out);
  GZ_LAUNCH_CHECK(widen_kernel);
}

template <class T>
void narrow(const float* in, std::size_t n, T* out, const std::uint32_t* gate, Stream stream) {
  if (n == 0) return;
  narrow_kernel<<<grid_for(n), kThreads, 0, stream>>>(in, n, out, gate);
  GZ_LAUNCH_CHECK(narrow_kernel);
}

template <class G>
void copy_encode(const G* g, float* r, std::size_t n, float* out, const Blob32& head, Stream stream) {
  if (n == 0 && !head.dst) return;
  const bool vec = vec_gradient(g) && aligned16(out) && (!r || aligned16(r));
  const unsigned grid = grid_for(vec ? n / 4 + 4 : n);
  if (r)
    copy_encode_kernel<true><<<grid, kThreads, 0, stream>>>(g, r, n, out, head, vec);
  else
    copy_encode_kernel<false><<<grid, kThreads, 0, stream>>>(g, r, n, out, head, vec);
  GZ_LAUNCH_CHECK(copy_encode_kernel);
}

void copy_decode(const float* in, std::size_t n, const DecodeOut& out, Combine c, const std::uint32_t* gate,
                 Stream stream) {
  if (n == 0) return;
  const bool vec = aligned16(in) && aligned16(out);
  with_out(out, [&](auto o) {
    copy_decode_kernel<<<decode_grid<4>(n, vec), kThreads, 0, stream>>>(in, n, o, c, gate, vec);
    GZ_LAUNCH_CHECK(copy_decode_kernel);
  });
}

template <class Fmt, class G>
void cast_encode(const G* g, float* r, std::size_t n, std::uint16_t* out, const Blob32& head, Stream stream) {
  if (n == 0 && !head.dst) return;
  const bool vec = vec_gradient(g) && aligned16(out) && (!r || aligned16(r));
  const unsigned grid = grid_for(vec ? n / 8 + 8 : n);
  if (r)
    cast_encode_kernel<Fmt, true><<<grid, kThreads, 0, stream>>>(g, r, n, out, head, vec);
  else
    cast_encode_kernel<Fmt, false><<<grid, kThreads, 0, stream>>>(g, r, n, out, head, vec);
  GZ_LAUNCH_CHECK(cast_encode_kernel);
}

template <class Fmt>
void cast_decode(const std::uint16_t* in, std::size_t n, const DecodeOut& out, Combine c, const std::uint32_t* gate,
                 Stream stream) {
  if (n == 0) return;
  const bool vec = aligned16(in) && aligned16(out);
  with_out(out, [&](auto o) {
    cast_decode_kernel<Fmt><<<decode_grid<8>(n, vec), kThreads, 0, stream>>>(in, n, o, c, gate, vec);
    GZ_LAUNCH_CHECK(cast_decode_kernel);
  });
}

#define GZ_INSTANTIATE(G)                                                                                      \
  template void widen(const G*, std::size_t, float*, Stream);                                                  \
  template void narrow(const float*, std::size_t, G*, const std::uint32_t*, Stream);                           \
  template void copy_encode(const G*, float*, std::size_t, float*, const Blob32&, Stream);                     \
  template void cast_encode<HalfFormat>(const G*, float*, std::size_t, std::uint16_t*, const Blob32&, Stream); \
  template void cast_encode<BFloat16Format>(const G*, float*, std::size_t, std::uint16_t*, const Blob32&, Stream);
GZ_FOR_EACH_GRAD(GZ_INSTANTIATE)
#undef GZ_INSTANTIATE
template void cast_decode<HalfFormat>(const std::uint16_t*, std::size_t, const DecodeOut&, Combine,
                                      const std::uint32_t*, Stream);
template void cast_decode<BFloat16Format>(const std::uint16_t*, std::size_t, const DecodeOut&, Combine,
                                          const std::uint32_t*, Stream);

}  // namespace gz::kernels::cuda
