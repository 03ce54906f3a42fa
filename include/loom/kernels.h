/* kernels.h - compute kernels: forward/backward pairs, float32.
 *
 * Each kernel below runs on the current backend (include/loom/backend.h,
 * chosen by --device): these names dispatch through the backend table, and
 * every pointer is that backend's device memory. The CPU bodies are the
 * loom_cpu_* functions of src/kernels/cpu; what follows is the contract every
 * backend keeps. The thread, precision and calibration settings and
 * loom_attention_tiles / loom_attention_kv_scratch_floats (sizes, no tensor
 * work) are the CPU's own and are not dispatched.
 *
 * Each kernel returns void and trusts its shapes: the model validates every
 * size once, up front. Backward kernels ACCUMULATE (+=) into parameter
 * gradients (dw, db, dwte, ...) so a tied or shared weight can collect from
 * several places, and also into activation gradients (dinp) unless the comment
 * says "writes". Pointers marked "may be NULL" skip that output.
 *
 * Weights of linear layers are stored [in, out] (C, OC), as Hugging Face's
 * GPT-2 Conv1D stores them; the tied LM head uses the embedding (V, C).
 * Shapes use B batch, T time, C channels, NH heads, HS = C/NH, V vocab,
 * N = B*T rows.
 *
 * Matmuls go to BLAS (OpenBLAS); elementwise loops are written to vectorize.
 * No kernel allocates memory.
 */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Compute threads. Built with OpenMP, loom runs one thread pool: OpenBLAS is
 * set to 1 thread and the kernels split rows (and attention heads) over n
 * OpenMP threads themselves, because two spinning pools slow each other down.
 * Without OpenMP, n goes to OpenBLAS. Call before sizing attention scratch. */
void loom_kernels_set_threads(int n);
int loom_kernels_get_threads(void);

/* GEMM precision: 0 fp32 (default); 1 bf16 mixed - every matmul's operands
 * rounded to bfloat16 (nearest, ties to even), fp32 accumulation and
 * everything else fp32 (src/kernels/cpu/bf16.c). Global, like the threads. */
void loom_kernels_set_precision(int bf16);
int loom_kernels_get_precision(void);
/* Kept GEMM operands, for bf16 mode: the caller promises that the n floats
 * at p do not change until loom_gemm_unkeep(p) (NULL: all), so every GEMM
 * that reads any part of them may use one bf16 conversion made at the first
 * (the same values as converting at each). At most eight at once; a ninth
 * is converted at every use, as without keeping. No effect in fp32. */
void loom_gemm_keep(const float *p, size_t n);
void loom_gemm_unkeep(const float *p);
/* 1 when kept operands are bf16 copies for a bf16 GEMM provider (bf16
 * precision, the provider ready): then keeping a large range costs 2 bytes
 * per float. */
int loom_gemm_keeps_bf16(void);
/* A kept operand the caller writes itself: the buffer for the bf16 bits of
 * [src, src + n) (NULL when loom_gemm_keeps_bf16 is 0, or no slot or
 * memory), to be filled from the floats the caller has just stored at src;
 * then loom_gemm_keep_filled(src, 1) - or 0 if it did not fill all of it.
 * The next loom_gemm_keep(src, n) then uses those bits without converting;
 * until then a GEMM converts as usual. The optimizer writes the parameters'
 * copy as it updates them (dp.c). */
uint16_t *loom_gemm_keep_fill(const float *src, size_t n);
void loom_gemm_keep_filled(const float *src, int ok);
/* dst[i] = src[i] rounded to bfloat16, kept as float (dst may be src). */
void loom_round_bf16(float *dst, const float *src, size_t n);
/* Host memory only (not through the backend): dst[i] = the bf16 bits of
 * src[i] rounded (loom/bf16.h), and back (exact); threaded like the kernels.
 * The bf16 gradient reductions use them (dp.c), on host-memory backends. */
void loom_bf16_pack(uint16_t *dst, const float *src, size_t n);
void loom_bf16_unpack(float *dst, const uint16_t *src, size_t n);

/* Measured single-precision GEMM throughput in FLOP/s with the current thread
 * count: after a warm-up, the best of `trials` sgemms of 1024^3, 2048^3 and
 * 2048 x 2304 x 768, each shape tried while the one before took under 0.1 s
 * (512^3 alone on a CPU too slow for 1024^3 in 0.25 s), threaded as the
 * model's matmuls are. */
double loom_kernels_calibrate_sgemm(int trials);
/* The bf16 GEMM provider's throughput the same way (the same shapes,
 * operands already bf16, best of `trials` each); 0 when there is no provider (loom/cpu.h). */
double loom_kernels_calibrate_bf16(int trials);
/* 1 when bf16 products run on a bf16 GEMM provider (oneDNN or oneMKL), 0
 * when they run as rounded floats on the fp32 kernels; decides it now. */
int loom_kernels_bf16_provider(void);

/* out (N,C) = layernorm(inp (N,C)) * w (C) + b (C), eps 1e-5; saves mean (N),
 * rstd (N). writes out, mean, rstd. */
void loom_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                        const float *b, int N, int C);
/* dinp (N,C) +=, dw (C) +=, db (C) +=; each may be NULL. */
void loom_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ w (C,OC) + b (OC). b may be NULL. writes out. */
void loom_matmul_fwd(float *out, const float *inp, const float *w, const float *b,
                     int N, int C, int OC);
/* dinp (N,C) += dout @ w^T; dw (C,OC) += inp^T @ dout; db (OC) += colsum(dout).
 * dinp, dw, db may be NULL. */
void loom_matmul_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC);

/* The tied LM head: out (N,V) = inp (N,C) @ wte (V,C)^T. writes out. */
void loom_matmul_nt_fwd(float *out, const float *inp, const float *wte, int N, int C, int V);
/* dinp (N,C) += dout (N,V) @ wte; dwte (V,C) += dout^T @ inp. Either may be NULL. */
void loom_matmul_nt_bwd(float *dinp, float *dwte, const float *dout, const float *inp,
                        const float *wte, int N, int C, int V);

/* GELU, tanh approximation (as GPT-2 and torch's approximate='tanh').
 * fwd writes out (n); bwd: dinp += gelu'(inp) * dout. */
void loom_gelu_fwd(float *out, const float *inp, size_t n);
void loom_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n);

/* out = a + b (n). writes out; out may alias a or b. */
void loom_residual_fwd(float *out, const float *a, const float *b, size_t n);
/* da += dout; db += dout. */
void loom_residual_bwd(float *da, float *db, const float *dout, size_t n);

/* Causal multi-head self-attention with softmax scale 1/sqrt(HS), computed
 * with online softmax in blocks (attention.c): memory is O(T), never T x T.
 * qkv (B,T,3C) holds [q | k | v] along the last axis, each C = NH*HS laid out
 * head by head. Writes out (B,T,C) and lse (B,NH,T), each row's log-sum-exp
 * of its scaled scores, which is all the backward needs besides out. */
void loom_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) += from dout (B,T,C), recomputing probabilities tile by tile. */
void loom_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out,
                        const float *lse, int B, int T, int C, int NH);

/* Partial attention, for context parallelism: queries of one sequence slice
 * attend to keys/values of another. Element (b, t, d) of head h of q sits at
 * q[b*q_bs + t*q_ld + h*HS + d], likewise k and v with kv_bs, kv_ld. Query t
 * has global position q_pos0 + t, key t has k_pos0 + t; a key is visible when
 * its position is <= the query's (causal). */
typedef struct {
    const float *q, *k, *v;
    size_t q_bs, kv_bs; /* batch strides (floats) */
    int q_ld, kv_ld;    /* row strides (floats) */
    int B, Tq, Tk, NH, HS;
    long q_pos0, k_pos0;
} loom_att_view;

/* out (b*o_bs + t*o_ld + h*HS ...) and lse (B,NH,Tq) WRITE the attention of
 * the queries to the visible keys of the view (rows that see none: out 0,
 * lse -inf). accumulate = 1 continues from the (out, lse) already there, as
 * if its keys had been part of this view (same result as loom_attention_merge
 * of two parts). Returns the (query tile x key tile) pairs computed, summed
 * over batch and heads: the attention work done. */
long loom_attention_part_fwd(const loom_att_view *v, float *out, size_t o_bs, int o_ld,
                             float *lse, int accumulate);
/* dq (strides of q) +=, dk, dv (strides of k) += the view's share of the
 * gradient, given the FINAL out and lse of the queries (after all parts were
 * merged) and dout (out's strides). Returns the tiles computed. */
long loom_attention_part_bwd(const loom_att_view *v, float *dq, float *dk, float *dv,
                             const float *dout, const float *out, size_t o_bs, int o_ld,
                             const float *lse);
/* (out, lse) = the merge of two partial results over disjoint key sets:
 * lse = log(e^lse + e^lse2), out = (e^lse out + e^lse2 out2) / e^lse_new. */
void loom_attention_merge(float *out, float *lse, const float *out2, const float *lse2,
                          size_t o_bs, int o_ld, int B, int Tq, int NH, int HS);
/* The tiles loom_attention_part_fwd / _bwd compute for view v. */
long loom_attention_tiles(const loom_att_view *v);
/* Inference: n new query rows at positions p0 .. p0+n-1 of one sequence,
 * q (n, ldq) holding NH heads of HS = C/NH, against its cache kc, vc
 * (p0+n, C) whose rows p0.. already hold the new keys and values. Row i
 * attends to positions 0 .. p0+i. Writes out (n,C). scratch:
 * loom_attention_kv_scratch_floats(n, p0+n) floats. */
void loom_attention_kv_fwd(float *out, const float *q, int ldq, const float *kc, const float *vc, int p0,
                           int n, int C, int NH, float *scratch);
size_t loom_attention_kv_scratch_floats(int n, int len);

/* ---- vocabulary-parallel embedding and cross-entropy ----------------------
 * A rank holds rows [v0, v0 + V_l) of the (padded) vocabulary; V_valid <= V_l
 * of them are real tokens, the rest padding that never takes part. With one
 * rank, v0 = 0 and V_l = V_valid = V.
 * Embedding: loom_embed_fwd on every rank, SUM over ranks, loom_pos_fwd.
 * Cross-entropy: loom_vxent_max, all-reduce MAX of rowmax; loom_vxent_exp,
 * all-reduce SUM of [rowsum | tgt]; loom_vxent_finish; later loom_vxent_bwd. */

/* out (N,C) WRITES wte_l[tok - v0] for tokens in this rank's range, 0 else. */
void loom_embed_fwd(float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N,
                    int C);
/* dwte_l (V_l,C) += dout rows of in-range tokens. */
void loom_embed_bwd(float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l, int N,
                    int C);
/* out (n,C) += wpe[(row0 + i) % T]: positions of rows row0 .. row0+n-1 of (B*T). */
void loom_pos_fwd(float *out, const float *wpe, int row0, int n, int T, int C);
/* dwpe (maxT,C) += the same rows of dout (n,C). */
void loom_pos_bwd(float *dwpe, const float *dout, int row0, int n, int T, int C);
/* rowmax (N) WRITES the max over the valid local columns (-inf if none). */
void loom_vxent_max(float *rowmax, const float *logits, int N, int V_l, int V_valid);
/* logits (N,V_l) become exp(logit - gmax) (padding 0); rowsum (N) WRITES
 * their sum; tgt (N) WRITES logit[target] - gmax where the target is local, 0 else. */
void loom_vxent_exp(float *logits, float *rowsum, float *tgt, const float *gmax,
                    const int32_t *targets, int v0, int N, int V_l, int V_valid);
/* The three phases above for a rank that holds the whole vocabulary (no
 * all-reduces between them; v0 = 0): logits (N,V_l) become the probs and
 * losses (N) WRITES the losses - the same floats as max, exp and finish.
 * Returns 0 (and does nothing) if the backend has no such kernel; the CPU's
 * makes one pass over the logits from memory instead of three. */
int loom_vxent_local(float *losses, float *logits, const int32_t *targets, int N, int V_l, int V_valid);
/* loom_vxent_local and loom_vxent_bwd (v0 = 0) together, for a backward
 * that follows with this dloss: losses (N) WRITES the losses, and logits
 * (N,V_l) is left kept (loom_gemm_keep) as the gradient (probs -
 * onehot(target)) * dloss - the same floats as the two kernels - for the
 * head's backward products, until the caller's loom_gemm_unkeep. Read it
 * only through those GEMMs: with a bf16 GEMM provider only the kept bf16
 * copy holds the gradient (the floats at logits are left as they were).
 * Returns 0 (and does nothing) if the backend has no such kernel. */
int loom_vxent_local_grad(float *losses, float *logits, const int32_t *targets, int N, int V_l, int V_valid,
                          float dloss);
/* losses (N) WRITES log(gsum) - gtgt (0 for target < 0); probs /= gsum. */
void loom_vxent_finish(float *losses, float *probs, const float *gsum, const float *gtgt,
                       const int32_t *targets, int N, int V_l);
/* dlogits (N,V_l) WRITES (probs - onehot(target)) * dloss (may alias probs);
 * rows with target < 0 get 0. */
void loom_vxent_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss, int v0,
                    int N, int V_l);

/* AdamW exactly as torch.optim.AdamW (decoupled decay, bias correction), on
 * the gradient scaled by gscale (the clip factor; 1 = unclipped):
 *   g' = g * gscale;  p *= 1 - lr*wd;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
 *   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 * t is the 1-based step count. g is only read: the same floats as scaling g
 * in place first (loom_scale) and updating with gscale 1, one pass fewer. */
void loom_adamw_update(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float wd, int t, float gscale);
/* loom_adamw_update (the same p, m, v), and g = 0 afterwards - the next
 * step's gradient zeroing in the same pass - and, unless p16 is NULL, the
 * new p's bf16 bits (loom_bf16_pack's) at p16. Returns 0 (and does nothing)
 * if the backend has no such kernel. */
int loom_adamw_update_zero(float *p, float *g, float *m, float *v, size_t n, float lr, float beta1,
                           float beta2, float eps, float wd, int t, float gscale, uint16_t *p16);

/* Sum of squares in double (for gradient norms); the same double whatever
 * the thread count. */
double loom_sumsq(const float *x, size_t n);
/* x *= s. */
void loom_scale(float *x, size_t n, float s);
/* 1 if every x[i] is finite. */
int loom_all_finite(const float *x, size_t n);

#endif
