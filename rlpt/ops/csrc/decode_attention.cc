// One-token attention over a KV cache, reading each row only up to its own length.
//
// An XLA FFI handler for the CPU (see rlpt/ops/decode_attention.py, which builds,
// registers and calls it). For row b and KV head h it reads the cached keys and
// values of slots j < length[b] with valid[b, j] and returns the pieces of a softmax
// that the caller merges with the new token's own key/value:
//   m[b, h, g] = max_j s_j, z[b, h, g] = sum_j exp(s_j - m), o[b, h, g, :] =
//   sum_j exp(s_j - m) v_j, with s_j = scale * <q[b, h, g], k[b, h, j]>.
// A row with no readable slot gets m = -1e30, z = 0, o = 0 (no weight after the merge).
// XLA's own version reads all S slots of every row; here a row costs what it holds.
// Work items (row, KV head) are shared by the calling thread and XLA's intra-op pool.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Shape {
  int64_t B, K, G, S, D;
};

// 16 floats; GCC lowers it to one AVX-512 or two AVX2 registers (or SSE pairs).
typedef float V16 __attribute__((vector_size(64), aligned(4)));

inline V16 Load(const float* p) {
  V16 x;
  __builtin_memcpy(&x, p, sizeof(x));
  return x;
}

typedef float V8 __attribute__((vector_size(32), aligned(4)));
typedef float V4 __attribute__((vector_size(16), aligned(4)));

// Lane sum as a tree (halves added), not a 15-long chain of scalar adds.
inline float Sum(V16 x) {
  V8 lo, hi;
  __builtin_memcpy(&lo, &x, 32);
  __builtin_memcpy(&hi, reinterpret_cast<const char*>(&x) + 32, 32);
  const V8 s8 = lo + hi;
  V4 a, b;
  __builtin_memcpy(&a, &s8, 16);
  __builtin_memcpy(&b, reinterpret_cast<const char*>(&s8) + 16, 16);
  const V4 s4 = a + b;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

typedef int32_t I16 __attribute__((vector_size(64), aligned(4)));

// exp(x) for x <= 0, 16 lanes: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two
// parts so n ln2 is exact), exp(r) by its degree-6 Taylor polynomial (relative error
// < 2e-7, about 2 ulp), times 2^n built in the exponent bits; x < -87 gives 0.
inline V16 Exp(V16 x) {
  const I16 keep = x >= -87.0f;  // all ones where the result is a normal float
  x = x < -87.0f ? V16{} - 87.0f : x;
  // Round x / ln2 to the nearest integer: adding 1.5 * 2^23 leaves no fraction bits.
  const V16 n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const V16 r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  V16 p = 1.0f / 720 + r * 0.0f;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const I16 bits = (__builtin_convertvector(n, I16) + 127) << 23;
  V16 scale2;
  __builtin_memcpy(&scale2, &bits, sizeof(bits));
  const V16 e = p * scale2;
  I16 out;
  __builtin_memcpy(&out, &e, sizeof(e));
  out &= keep;
  V16 res;
  __builtin_memcpy(&res, &out, sizeof(out));
  return res;
}

// One (row, KV head) with G query heads of NC x 16 dims: `idx` lists the n readable
// slots, `buf` holds G x n scores, then their exponentials. Each key and value row is
// loaded once for all G queries.
template <int G, int NC>
void OneItemGD(const float* qi, const float* ki, const float* vi, const int32_t* idx,
               int64_t n, float scale, float* mi, float* zi, float* oi, float* buf) {
  constexpr int64_t D = NC * 16;
  V16 qv[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) qv[g][c] = Load(qi + g * D + 16 * c) * scale;
  float m[G];
  for (int g = 0; g < G; ++g) m[g] = -1e30f;
  for (int64_t t = 0; t < n; ++t) {
    const float* kj = ki + idx[t] * D;
    V16 kv[NC];
    for (int c = 0; c < NC; ++c) kv[c] = Load(kj + 16 * c);
    for (int g = 0; g < G; ++g) {
      V16 a = qv[g][0] * kv[0];
      for (int c = 1; c < NC; ++c) a += qv[g][c] * kv[c];
      const float s = Sum(a);
      buf[g * n + t] = s;
      m[g] = std::max(m[g], s);
    }
  }
  float z[G];
  for (int g = 0; g < G; ++g) {
    float* sg = buf + g * n;
    V16 zz = {0};
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {
      const V16 e = Exp(Load(sg + t) - m[g]);
      __builtin_memcpy(sg + t, &e, sizeof(e));
      zz += e;
    }
    float zs = Sum(zz);
    for (; t < n; ++t) {
      sg[t] = std::exp(sg[t] - m[g]);
      zs += sg[t];
    }
    z[g] = zs;
  }
  V16 o[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) o[g][c] = V16{0};
  for (int64_t t = 0; t < n; ++t) {
    const float* vj = vi + idx[t] * D;
    V16 vv[NC];
    for (int c = 0; c < NC; ++c) vv[c] = Load(vj + 16 * c);
    for (int g = 0; g < G; ++g) {
      const float p = buf[g * n + t];
      for (int c = 0; c < NC; ++c) o[g][c] += p * vv[c];
    }
  }
  for (int g = 0; g < G; ++g) {
    mi[g] = n ? m[g] : -1e30f;
    zi[g] = z[g];
    __builtin_memcpy(oi + g * D, o[g], sizeof(o[g]));
  }
}

void OneItemAny(int64_t G, int64_t D, const float* qi, const float* ki, const float* vi,
                const int32_t* idx, int64_t n, float scale, float* mi, float* zi, float* oi,
                float* buf) {
  for (int64_t g = 0; g < G; ++g) {
    float* sg = buf + g * n;
    float m = -1e30f;
    for (int64_t t = 0; t < n; ++t) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += qi[g * D + d] * ki[idx[t] * D + d];
      sg[t] = s * scale;
      m = std::max(m, sg[t]);
    }
    float z = 0.f;
    float* og = oi + g * D;
    std::fill(og, og + D, 0.f);
    for (int64_t t = 0; t < n; ++t) {
      const float p = std::exp(sg[t] - m);
      z += p;
      for (int64_t d = 0; d < D; ++d) og[d] += p * vi[idx[t] * D + d];
    }
    mi[g] = m;
    zi[g] = z;
  }
}

void OneItem(const Shape& sh, int64_t item, const float* q, const float* k, const float* v,
             const bool* valid, const int32_t* length, float scale, float* m, float* z,
             float* o, std::vector<float>& buf, std::vector<int32_t>& idx) {
  const int64_t b = item / sh.K, G = sh.G, D = sh.D, S = sh.S;
  const int64_t len = std::clamp<int64_t>(length[b], 0, S);
  const bool* ok = valid + b * S;
  idx.resize(static_cast<size_t>(std::max<int64_t>(len, 1)));
  int64_t n = 0;
  for (int64_t j = 0; j < len; ++j)
    if (ok[j]) idx[n++] = static_cast<int32_t>(j);
  buf.resize(static_cast<size_t>(G * std::max<int64_t>(n, 1)));
  const float* qi = q + item * G * D;
  const float* ki = k + item * S * D;
  const float* vi = v + item * S * D;
  float* mi = m + item * G;
  float* zi = z + item * G;
  float* oi = o + item * G * D;
#define RLPT_CASE(GG, NN) \
  if (G == GG && D == NN * 16) \
    return OneItemGD<GG, NN>(qi, ki, vi, idx.data(), n, scale, mi, zi, oi, buf.data());
  RLPT_CASE(1, 4) RLPT_CASE(2, 4) RLPT_CASE(3, 4) RLPT_CASE(4, 4)
  RLPT_CASE(1, 8) RLPT_CASE(2, 8) RLPT_CASE(3, 8) RLPT_CASE(4, 8)
#undef RLPT_CASE
  {
    OneItemAny(G, D, qi, ki, vi, idx.data(), n, scale, mi, zi, oi, buf.data());
  }
}

// Items claimed from a shared counter; the state outlives the call for pool tasks that
// start after the caller has finished every item.
struct Job {
  Shape sh;
  const float *q, *k, *v;
  const bool* valid;
  const int32_t* length;
  float scale;
  float *m, *z, *o;
  int64_t items;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    std::vector<float> buf;
    std::vector<int32_t> idx;
    int64_t finished = 0;
    for (int64_t i; (i = next.fetch_add(1)) < items; ++finished)
      OneItem(sh, i, q, k, v, valid, length, scale, m, z, o, buf, idx);
    if (finished && done.fetch_add(finished) + finished == items) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }
};

ffi::Error DecodeAttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                               ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                               ffi::Buffer<ffi::PRED> valid, ffi::Buffer<ffi::S32> length,
                               ffi::ResultBuffer<ffi::F32> m, ffi::ResultBuffer<ffi::F32> z,
                               ffi::ResultBuffer<ffi::F32> o, float scale) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return ffi::Error::InvalidArgument("decode_attention: q, k, v must be rank 4");
  Shape sh{qd[0], qd[1], qd[2], kd[2], qd[3]};
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && kd[i] == vd[i];
  if (kd[0] != sh.B || kd[1] != sh.K || kd[3] != sh.D || !same)
    return ffi::Error::InvalidArgument("decode_attention: q [B,K,G,D], k/v [B,K,S,D] mismatch");
  auto job = std::make_shared<Job>();
  job->sh = sh;
  job->q = q.typed_data();
  job->k = k.typed_data();
  job->v = v.typed_data();
  job->valid = valid.typed_data();
  job->length = length.typed_data();
  job->scale = scale;
  job->m = m->typed_data();
  job->z = z->typed_data();
  job->o = o->typed_data();
  job->items = sh.B * sh.K;
  if (job->items == 0) return ffi::Error::Success();
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), job->items) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == job->items; });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RlptDecodeAttention, DecodeAttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale"));
