/* The decode step's attention for the CPU lab's model (phantom.lab.decode_kernel).
 *
 * torch computes a decode step's attention as two batched matmuls over (row, kv-head) matrices of
 * 2 x 24 queries against up to ~180 keys; at that size its bmm costs ~0.5 us per matrix whatever the
 * matrix holds, so attention was ~40% of the lab's sampling time. These loops compute the same
 * numbers, bit for bit, in one pass over each row's cache:
 *
 *   decode_scores  rotary embedding of the step's query and key heads (x*cos + rot(x)*sin, each
 *                  product rounded, then the sum), the new key (into a transposed cache, so that
 *                  keys vectorize) and value written at `slot`, and (q . k) * scale + bias per key,
 *                  summed in the order torch 2.13's kernel sums (see scores_row);
 *   decode_mix     softmax weights times values, one sequential sum over keys per output.
 *
 * Built with -ffp-contract=off and without -ffast-math, so every product and sum is rounded exactly as
 * written; vectorizing across independent keys or output features changes no order. Python checks the
 * result against torch before using it (decode_kernel.py) and falls back to torch otherwise. */
#include <stddef.h>
#include <stdint.h>

/* Keys in blocks of four: four partial sums over d (d mod 4), then (p0 + p2) + (p1 + p3). The head
 * size is a constant in the two specialisations, so the d loop unrolls and the key loop vectorizes. */
#define LANES4_BODY(DD)                                                                            \
    for (int j = 0; j < S4; j++) {                                                                 \
        float s0 = q[0] * K[j], s1 = q[1] * K[L + j], s2 = q[2] * K[2 * L + j], s3 = q[3] * K[3 * L + j]; \
        _Pragma("GCC unroll 16")                                                                   \
        for (int d = 4; d < (DD); d += 4) {                                                        \
            s0 = s0 + q[d] * K[d * L + j];                                                         \
            s1 = s1 + q[d + 1] * K[(d + 1) * L + j];                                               \
            s2 = s2 + q[d + 2] * K[(d + 2) * L + j];                                               \
            s3 = s3 + q[d + 3] * K[(d + 3) * L + j];                                               \
        }                                                                                          \
        out[j] = ((s0 + s2) + (s1 + s3)) * scale + b[j];                                           \
    }

static void lanes4_24(const float *restrict q, const float *restrict K, int L, const float *restrict b,
                      int S4, float scale, float *restrict out) { LANES4_BODY(24) }
static void lanes4_16(const float *restrict q, const float *restrict K, int L, const float *restrict b,
                      int S4, float scale, float *restrict out) { LANES4_BODY(16) }
static void lanes4_any(const float *restrict q, const float *restrict K, int L, const float *restrict b,
                       int S4, int D, float scale, float *restrict out) { LANES4_BODY(D) }

/* The last S mod 4 keys: eight partial sums over d (d mod 8), added as a halving tree. */
static void tail8(const float *q, const float *K, const float *b, int D, int L, int from, int S, float scale,
                  float *out) {
    for (int j = from; j < S; j++) {
        float a[8];
        for (int d = 0; d < 8; d++) a[d] = q[d] * K[d * L + j];
        for (int d = 8; d < D; d++) a[d & 7] = a[d & 7] + q[d] * K[d * L + j];
        out[j] = (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))) * scale + b[j];
    }
}

/* The same for the two query heads of one kv head at once (the lab's models: 4 heads on 2 kv heads),
 * reading each key once. */
#define PAIR4_BODY(DD)                                                                             \
    for (int j = 0; j < S4; j++) {                                                                 \
        float k0 = K[j], k1 = K[L + j], k2 = K[2 * L + j], k3 = K[3 * L + j];                       \
        float s0 = q[0] * k0, s1 = q[1] * k1, s2 = q[2] * k2, s3 = q[3] * k3;                     \
        float t0 = p[0] * k0, t1 = p[1] * k1, t2 = p[2] * k2, t3 = p[3] * k3;                     \
        _Pragma("GCC unroll 16")                                                                   \
        for (int d = 4; d < (DD); d += 4) {                                                        \
            k0 = K[d * L + j]; k1 = K[(d + 1) * L + j]; k2 = K[(d + 2) * L + j]; k3 = K[(d + 3) * L + j]; \
            s0 = s0 + q[d] * k0; s1 = s1 + q[d + 1] * k1; s2 = s2 + q[d + 2] * k2; s3 = s3 + q[d + 3] * k3; \
            t0 = t0 + p[d] * k0; t1 = t1 + p[d + 1] * k1; t2 = t2 + p[d + 2] * k2; t3 = t3 + p[d + 3] * k3; \
        }                                                                                          \
        out[j] = ((s0 + s2) + (s1 + s3)) * scale + b[j];                                           \
        out2[j] = ((t0 + t2) + (t1 + t3)) * scale + b[j];                                          \
    }

static void pair4_24(const float *restrict q, const float *restrict p, const float *restrict K, int L,
                     const float *restrict b, int S4, float scale, float *restrict out, float *restrict out2) {
    PAIR4_BODY(24)
}
static void pair4_16(const float *restrict q, const float *restrict p, const float *restrict K, int L,
                     const float *restrict b, int S4, float scale, float *restrict out, float *restrict out2) {
    PAIR4_BODY(16)
}

/* One query head against keys [0, S) of its kv head; K is that head's transposed cache (D x L). */
static void scores_row(const float *q, const float *K, const float *b, int D, int L, int S, int naive,
                       float scale, float *out) {
    if (naive) { /* torch's small-matrix path (keys x queries x head size < 400): one sum from zero */
        for (int j = 0; j < S; j++) {
            float s = 0.0f;
            for (int d = 0; d < D; d++) s = s + q[d] * K[d * L + j];
            out[j] = s * scale + b[j];
        }
        return;
    }
    int S4 = S & ~3;
    if (D == 24) lanes4_24(q, K, L, b, S4, scale, out);
    else if (D == 16) lanes4_16(q, K, L, b, S4, scale, out);
    else lanes4_any(q, K, L, b, S4, D, scale, out);
    tail8(q, K, b, D, L, S4, S, scale, out);
}

static void rotate(const float *x, const float *c, const float *s, int D, float *y) {
    int h2 = D / 2;
    for (int d = 0; d < h2; d++) { float a = x[d] * c[d]; float b = -x[d + h2] * s[d]; y[d] = a + b; }
    for (int d = h2; d < D; d++) { float a = x[d] * c[d]; float b = x[d - h2] * s[d]; y[d] = a + b; }
}

/* qkv: n x (H + 2 KV) D, the step's projections of the n active rows; cos_t, sin_t: rotary tables
 * (positions x D); pos: n positions; rows: each active row's row in the caches, kt: B x KV x D x L keys
 * (transposed), vc: B x KV x L x D values, bias: B x L (0 or -inf), so finished rows leave the batch
 * without a copy of the caches; att: n x KV x g x (slot + 1) scores out.
 * Returns 0, or 1 if a size is out of range. */
int decode_scores(int n, int H, int KV, int D, int L, int slot, const float *qkv, const float *cos_t,
                  const float *sin_t, const int64_t *pos, const int64_t *rows, float *kt, float *vc,
                  const float *bias, float scale, float *att) {
    if (H > 64 || D > 64 || D % 8 || KV < 1 || H % KV || slot < 0 || slot >= L) return 1;
    int g = H / KV, S = slot + 1, W = (H + 2 * KV) * D;
    int naive = (int64_t)S * g * D < 400;
    float qrot[64 * 64], krot[64];
    for (int r = 0; r < n; r++) {
        const float *x = qkv + (size_t)r * W;
        size_t pr = (size_t)rows[r];
        const float *c = cos_t + (size_t)pos[r] * D, *s = sin_t + (size_t)pos[r] * D;
        for (int h = 0; h < H; h++) rotate(x + h * D, c, s, D, qrot + h * D);
        for (int h = 0; h < KV; h++) {
            rotate(x + (H + h) * D, c, s, D, krot);
            float *kdst = kt + (pr * KV + h) * D * L + slot;
            for (int d = 0; d < D; d++) kdst[(size_t)d * L] = krot[d];
            const float *v = x + (H + KV + h) * D;
            float *vdst = vc + ((pr * KV + h) * L + slot) * D;
            for (int d = 0; d < D; d++) vdst[d] = v[d];
        }
        for (int h = 0; h < KV; h++) {
            const float *K = kt + (pr * KV + h) * D * L, *b = bias + pr * L;
            float *o = att + ((size_t)r * KV + h) * g * S;
            if (g == 2 && !naive && (D == 24 || D == 16)) { /* keys in blocks of four for both heads, then the rest */
                int S4 = S & ~3;
                if (D == 24) pair4_24(qrot + 2 * h * D, qrot + (2 * h + 1) * D, K, L, b, S4, scale, o, o + S);
                else pair4_16(qrot + 2 * h * D, qrot + (2 * h + 1) * D, K, L, b, S4, scale, o, o + S);
                if (S4 < S)
                    for (int i = 0; i < 2; i++) tail8(qrot + (2 * h + i) * D, K, b, D, L, S4, S, scale, o + i * S);
                continue;
            }
            for (int i = 0; i < g; i++) scores_row(qrot + (h * g + i) * D, K, b, D, L, S, naive, scale, o + i * S);
        }
    }
    return 0;
}

/* Both query heads of a kv head in one pass over its values (A: 2 x S weights, o: 2 x D outputs). */
#define MIXPAIR_BODY(DD)                                                                   \
    float a0[DD], a1[DD];                                                                  \
    for (int d = 0; d < (DD); d++) { a0[d] = A[0] * V[d]; a1[d] = A[S] * V[d]; }           \
    for (int j = 1; j < S; j++) {                                                          \
        float w0 = A[j], w1 = A[S + j];                                                    \
        const float *Vj = V + (size_t)j * (DD);                                            \
        for (int d = 0; d < (DD); d++) { a0[d] = a0[d] + w0 * Vj[d]; a1[d] = a1[d] + w1 * Vj[d]; } \
    }                                                                                      \
    for (int d = 0; d < (DD); d++) { o[d] = a0[d]; o[(DD) + d] = a1[d]; }
static void mix_pair24(const float *restrict A, const float *restrict V, int S, float *restrict o) { MIXPAIR_BODY(24) }
static void mix_pair16(const float *restrict A, const float *restrict V, int S, float *restrict o) { MIXPAIR_BODY(16) }

/* att: n x KV x g x S softmax weights; rows, vc: as in decode_scores; out: n x (KV g D), heads in the
 * order kv head, then query within it. Returns 0, or 1 if a size is out of range. */
int decode_mix(int n, int KV, int g, int D, int L, int S, const float *att, const int64_t *rows, const float *vc,
               float *out) {
    if (D > 64 || D % 8 || S < 1 || S > L) return 1;
    float acc[64];
    for (int r = 0; r < n; r++)
        for (int h = 0; h < KV; h++) {
            const float *V = vc + ((size_t)rows[r] * KV + h) * L * D;
            if (g == 2 && D == 24) { mix_pair24(att + ((size_t)r * KV + h) * 2 * S, V, S, out + (size_t)r * KV * 2 * D + 2 * h * D); continue; }
            if (g == 2 && D == 16) { mix_pair16(att + ((size_t)r * KV + h) * 2 * S, V, S, out + (size_t)r * KV * 2 * D + 2 * h * D); continue; }
            for (int i = 0; i < g; i++) {
                const float *A = att + (((size_t)r * KV + h) * g + i) * S;
                float *o = out + (size_t)r * KV * g * D + (h * g + i) * D;
#define MIX_BODY(DD)                                                              \
                for (int d = 0; d < (DD); d++) acc[d] = A[0] * V[d];              \
                for (int j = 1; j < S; j++) {                                     \
                    float w = A[j];                                               \
                    const float *Vj = V + (size_t)j * D;                          \
                    for (int d = 0; d < (DD); d++) acc[d] = acc[d] + w * Vj[d];   \
                }                                                                 \
                for (int d = 0; d < (DD); d++) o[d] = acc[d];
                if (D == 24) { MIX_BODY(24) } else if (D == 16) { MIX_BODY(16) } else { MIX_BODY(D) }
#undef MIX_BODY
            }
        }
    return 0;
}
