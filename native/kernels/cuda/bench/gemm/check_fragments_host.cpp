// check_fragments_host — a host-only (no GPU) check of gemm_mma.cu's register tricks, written
// while the device was withdrawn (session 5): the signed-byte lookups e2m1_s8 / w4_s8 (gemm_mma_impl.cuh) over all
// 65536 inputs, and the NVFP4-on-f16-mma path (kernel format 3, session 8's f16 tiles in shared
// memory): every E2M1 code in every position times every E4M3 scale by bit placement (exact,
// value x scale x 2^-7), the q8 -> f16 rows in the same k order, and one 16 x 8 x 32 tile through
// the f16 rows and the ldmatrix / mma.m16n8k16 fragment layouts as the PTX ISA gives them,
// against the direct sum. The helpers are copies (prmt emulated in its default mode, sign
// replication on selector bit 3): keep them in step with gemm_mma_impl.cuh.
// Build and run:  g++ -O2 -o /tmp/cf check_fragments_host.cpp && /tmp/cf
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <random>
static uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint8_t by[8];
  for (int i = 0; i < 4; ++i) by[i] = a >> (8 * i), by[4 + i] = b >> (8 * i);
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    uint32_t sel = (s >> (4 * n)) & 0xF;
    uint8_t v = by[sel & 7];
    if (sel & 8) v = (v & 0x80) ? 0xFF : 0x00;
    r |= uint32_t(v) << (8 * n);
  }
  return r;
}
static float h2f(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v = e ? std::ldexp(1.0f + m / 1024.0f, e - 15) : std::ldexp(m / 1024.0f, -14);
  return s ? -v : v;
}
static uint16_t f2h(float f) {  // exact values only
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  int s = f < 0; f = std::fabs(f);
  int e; float fr = std::frexp(f, &e);  // f = fr * 2^e, fr in [0.5,1)
  int E = e - 1 + 15; float mant = fr * 2 - 1;
  if (E <= 0) { int m = int(std::lround(f / std::ldexp(1.0f, -24))); return uint16_t((s << 15) | m); }
  int m = int(std::lround(mant * 1024));
  return uint16_t((s << 15) | (E << 10) | m);
}
static uint32_t hadd2(uint32_t a, uint32_t b) {
  return f2h(h2f(a & 0xFFFF) + h2f(b & 0xFFFF)) | (uint32_t(f2h(h2f(a >> 16) + h2f(b >> 16))) << 16);
}
static uint32_t hmul2(uint32_t a, uint32_t b) {
  return f2h(h2f(a & 0xFFFF) * h2f(b & 0xFFFF)) | (uint32_t(f2h(h2f(a >> 16) * h2f(b >> 16))) << 16);
}
static float e4m3(uint8_t b) {
  int e = (b >> 3) & 15, m = b & 7;
  return e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp(m / 8.0f, -6);
}
static const float e2m1v[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6};

// gemm_mma_impl.cuh, kernel format 3: tiles made f16 in shared memory, each 8-group of k stored
// as k 0, 2, 4, 6, 1, 3, 5, 7 in both tiles; B values carry 2^-7
static void i8x8_to_h8(uint32_t x, uint32_t y, uint32_t r[4]) {
  x ^= 0x80808080u, y ^= 0x80808080u;
  const uint32_t w[4] = {prmt(x, 0x64646464u, 0x4240u), prmt(y, 0x64646464u, 0x4240u),
                         prmt(x, 0x64646464u, 0x4341u), prmt(y, 0x64646464u, 0x4341u)};
  for (int i = 0; i < 4; ++i) r[i] = hadd2(w[i], 0xE480E480u);
}
static void e2m1x8_to_h8(uint32_t w, uint32_t sc, uint32_t r[4]) {
  const uint32_t o = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
  const uint32_t e = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
  const uint32_t v[4] = {prmt(e, 0u, 0x1404u), prmt(e, 0u, 0x3424u), prmt(o, 0u, 0x1404u), prmt(o, 0u, 0x3424u)};
  for (int i = 0; i < 4; ++i) r[i] = hmul2(v[i], sc);
}
static uint32_t e4m3_h2_x128(uint32_t b) {
  const uint32_t w = prmt(b, 0u, 0x4040u);
  return hmul2(((w & 0x007F007Fu) << 7) | ((w & 0x00800080u) << 8), 0x78007800u);
}
static int check_f16s_path() {
  int bad = 0;
  // every code in every position with every finite scale byte: value x scale x 2^-7, exact
  for (uint32_t sb = 0; sb < 256; ++sb) {
    if ((sb & 0x7F) == 0x7F) continue;  // E4M3 NaN: never written by the encoder
    const uint32_t sc = e4m3_h2_x128(sb);
    const double sv = (sb & 0x80 ? -1.0 : 1.0) * e4m3(uint8_t(sb & 0x7F));
    if (h2f(sc & 0xFFFF) != sv * 128 || h2f(sc >> 16) != sv * 128) { if (bad < 5) printf("scale %02x\n", sb); bad++; }
    for (int c = 0; c < 16; ++c)
      for (int pos = 0; pos < 8; ++pos) {
        const uint32_t w = 0x11111111u * 9 ^ (uint32_t(c) << (4 * pos)) ^ (0x9u << (4 * pos));  // others code 9 (-0.5)
        uint32_t r[4];
        e2m1x8_to_h8(w, sc, r);
        const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
        for (int j = 0; j < 8; ++j) {
          const int k = order[j];
          const int code = (w >> (4 * k)) & 15;
          const double got = h2f(j & 1 ? r[j / 2] >> 16 : r[j / 2] & 0xFFFF), want = e2m1v[code] * sv / 128;
          if (got != want) { if (bad < 5) printf("e2m1 code %d pos %d scale %02x: %g vs %g\n", code, k, sb, got, want); bad++; }
        }
      }
  }
  // one 16-row x 32-k tile through the f16 rows and ldmatrix as the kernel addresses them
  std::mt19937 rng(2);
  const int H_LD = 72;
  for (int trial = 0; trial < 200; ++trial) {
    int8_t q[16][32];
    uint8_t codes[8][32], sc[8][2];
    for (int r = 0; r < 16; ++r) for (int k = 0; k < 32; ++k) q[r][k] = int8_t(int(rng() % 256) - 128);
    for (int c = 0; c < 8; ++c) for (int k = 0; k < 32; ++k) codes[c][k] = rng() % 16;
    for (int c = 0; c < 8; ++c) for (int b = 0; b < 2; ++b) sc[c][b] = uint8_t(rng() % 0x7F) | (rng() % 2 ? 0x80 : 0);
    uint16_t hA[16 * 72], hB[8 * 72];
    for (int r = 0; r < 16; ++r)
      for (int g8 = 0; g8 < 4; ++g8) {
        uint32_t x, y, o[4];
        memcpy(&x, &q[r][8 * g8], 4), memcpy(&y, &q[r][8 * g8 + 4], 4);
        i8x8_to_h8(x, y, o);
        memcpy(&hA[r * H_LD + 8 * g8], o, 16);
      }
    for (int c = 0; c < 8; ++c)
      for (int g8 = 0; g8 < 4; ++g8) {
        uint32_t w = 0;
        for (int i = 0; i < 8; ++i) w |= uint32_t(codes[c][8 * g8 + i]) << (4 * i);
        uint32_t o[4];
        e2m1x8_to_h8(w, e4m3_h2_x128(sc[c][g8 / 2]), o);
        memcpy(&hB[c * H_LD + 8 * g8], o, 16);
      }
    // ldmatrix.x4: lane l's register i = matrix i, row l / 4, halves 2 (l % 4), +1; matrix i's rows from lanes 8i..8i+7
    auto ldsm = [&](const uint16_t* base, int (*row_of)(int), int (*col_of)(int), int lane, uint32_t r[4]) {
      for (int i = 0; i < 4; ++i) {
        const int src = 8 * i + (lane >> 2);
        const uint16_t* p = base + row_of(src) * H_LD + col_of(src) + 2 * (lane & 3);
        r[i] = uint32_t(p[0]) | (uint32_t(p[1]) << 16);
      }
    };
    double Am[16][32], Bm[32][8];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      uint32_t a0[4], a1[4], b[4];
      ldsm(hA, [](int l) { return l & 15; }, [](int l) { return (l >> 4) * 8; }, lane, a0);
      ldsm(hA, [](int l) { return l & 15; }, [](int l) { return (l >> 4) * 8 + 16; }, lane, a1);
      ldsm(hB, [](int l) { return l & 7; }, [](int l) { return (l >> 3) * 8; }, lane, b);
      auto lo = [](uint32_t v) { return h2f(v & 0xFFFF); };
      auto hi = [](uint32_t v) { return h2f(v >> 16); };
      for (int h = 0; h < 2; ++h) {  // k16 half h: the mma's k index kk = 16 h + ..
        const uint32_t* a = h ? a1 : a0;
        const int o = 16 * h;
        Am[g][o + 2 * t] = lo(a[0]), Am[g][o + 2 * t + 1] = hi(a[0]);
        Am[g + 8][o + 2 * t] = lo(a[1]), Am[g + 8][o + 2 * t + 1] = hi(a[1]);
        Am[g][o + 2 * t + 8] = lo(a[2]), Am[g][o + 2 * t + 9] = hi(a[2]);
        Am[g + 8][o + 2 * t + 8] = lo(a[3]), Am[g + 8][o + 2 * t + 9] = hi(a[3]);
        Bm[o + 2 * t][g] = lo(b[2 * h]), Bm[o + 2 * t + 1][g] = hi(b[2 * h]);
        Bm[o + 2 * t + 8][g] = lo(b[2 * h + 1]), Bm[o + 2 * t + 9][g] = hi(b[2 * h + 1]);
      }
    }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) {
        double got = 0, want = 0;
        for (int k = 0; k < 32; ++k) got += Am[r][k] * Bm[k][c];
        got *= 128;
        for (int k = 0; k < 32; ++k)
          want += double(q[r][k]) * e2m1v[codes[c][k]] * (sc[c][k / 16] & 0x80 ? -1 : 1) * e4m3(sc[c][k / 16] & 0x7F);
        if (std::fabs(want - got) > 1e-9 * (1 + std::fabs(want))) { if (bad < 5) printf("f16s r%d c%d want %g got %g\n", r, c, want, got); bad++; }
      }
  }
  return bad;
}

static uint32_t lookup16_s8(uint32_t x, uint32_t pos0, uint32_t pos1, uint32_t neg0, uint32_t neg1, uint32_t nz0, uint32_t nz1) {
  const uint32_t xn = x ^ 0x8888u;
  const uint32_t p = prmt(pos0, pos1, x);
  const uint32_t n = prmt(neg0, neg1, xn);
  const uint32_t c = prmt(nz0, nz1, (xn << 4) | 0x8u);
  return p - n + c;
}
static uint32_t e2m1_s8(uint32_t x) { return lookup16_s8(x, 0x03020100u, 0x0C080604u, 0x03020100u, 0x0C080604u, 0x01010100u, 0x01010101u); }
static uint32_t w4_s8(uint32_t x) {
  const uint32_t xn = x ^ 0x8888u;
  const uint32_t p = prmt(0x03020100u, 0x07060504u, xn);
  const uint32_t n = prmt(0x05060708u, 0x01020304u, x);
  const uint32_t c = prmt(0x01010101u, 0x01010101u, (x << 4) | 0x8u);
  return p - n + c;
}
static int check_lookups() {
  const int e2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  int bad = 0;
  for (uint32_t x = 0; x < 65536; ++x) {
    uint32_t a = e2m1_s8(x), b = w4_s8(x);
    for (int j = 0; j < 4; ++j) {
      int c = (x >> (4 * j)) & 15;
      if (int8_t(a >> (8 * j)) != e2[c]) bad++;
      if (int8_t(b >> (8 * j)) != c - 8) bad++;
    }
  }
  return bad;
}

int main() {
  const int a = check_lookups(), c = check_f16s_path();
  std::printf("signed-byte lookups: %d wrong; f16 tiles in shared memory (fragments, conversions): %d wrong\n", a, c);
  return a || c;
}
