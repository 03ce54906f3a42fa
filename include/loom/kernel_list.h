/* kernel_list.h - every kernel of every backend, declared once.
 *
 * One line per kernel:
 *
 *     LOOM_KERNEL(ret, name, (parameters), (arguments), REQUIRED | OPTIONAL)
 *
 *   ret          what the kernel returns, one identifier (void, int, long,
 *                double, loom_bf16_buf: kernels.h's LOOM_KERNEL_RETURN_<ret>
 *                says how generated code hands the value on; a new type
 *                needs one line there)
 *   name         loom_<name> is the kernel as callers call it (kernels.h),
 *                <name> its entry in the backend table (backend.h), and
 *                loom_cpu_<name> / loom_cuda_<name> its bodies
 *   parameters   its parameter list, without the device (callers) or the
 *                backend context (the table, the bodies), which come first
 *   arguments    the same names as an argument list, for the dispatchers
 *   REQUIRED     every backend implements it
 *   OPTIONAL     a fused form of required kernels; ret is void; a backend
 *                may leave the entry NULL. Its loom_<name> returns 1 when it
 *                ran and 0, having done nothing, when the backend has none
 *                (the caller then runs the unfused kernels).
 *
 * This file has no include guard: each user defines LOOM_KERNEL, includes
 * it, and undefines LOOM_KERNEL. The users, each generating one thing:
 * kernels.h (the dispatchers' prototypes), backend.h (the table's entries),
 * src/backend/backend.c (the dispatchers and the required-entry check),
 * src/kernels/cpu/cpu_kernels.h and src/backend/cpu_backend.c (the CPU
 * prototypes and table), src/backend/cuda/cuda_backend.h and
 * src/backend/cuda_table.c (the CUDA prototypes and table; the CUDA backend
 * implements the REQUIRED kernels). Adding a kernel is one line here (with
 * its contract in the comment above it) and its bodies.
 *
 * The contract every backend keeps (kernels.h has the conventions: shapes,
 * what "writes" and "+=" mean, NULL outputs): every tensor pointer is device
 * memory of the backend, host pointers are named `host`.
 */

/* ---- dense layers ------------------------------------------------------ */

/* out (N,C) = layernorm(inp (N,C)) * w (C) + b (C), eps 1e-5; saves mean (N),
 * rstd (N). writes out, mean, rstd. */
LOOM_KERNEL(void, layernorm_fwd,
            (float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
             int C),
            (out, mean, rstd, inp, w, b, N, C), REQUIRED)
/* dinp (N,C) +=, dw (C) +=, db (C) +=; each may be NULL. */
LOOM_KERNEL(void, layernorm_bwd,
            (float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
             const float *mean, const float *rstd, int N, int C),
            (dinp, dw, db, dout, inp, w, mean, rstd, N, C), REQUIRED)
/* out (N,OC) = inp (N,C) @ w (C,OC) + b (OC). b may be NULL. writes out. */
LOOM_KERNEL(void, matmul_fwd,
            (float *out, const float *inp, const float *w, const float *b, int N, int C, int OC),
            (out, inp, w, b, N, C, OC), REQUIRED)
/* dinp (N,C) += dout @ w^T; dw (C,OC) += inp^T @ dout; db (OC) += colsum(dout).
 * dinp, dw, db may be NULL. */
LOOM_KERNEL(void, matmul_bwd,
            (float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w, int N,
             int C, int OC),
            (dinp, dw, db, dout, inp, w, N, C, OC), REQUIRED)
/* The tied LM head: out (N,V) = inp (N,C) @ wte (V,C)^T. writes out. */
LOOM_KERNEL(void, matmul_nt_fwd, (float *out, const float *inp, const float *wte, int N, int C, int V),
            (out, inp, wte, N, C, V), REQUIRED)
/* dinp (N,C) += dout (N,V) @ wte; dwte (V,C) += dout^T @ inp. Either may be NULL. */
LOOM_KERNEL(void, matmul_nt_bwd,
            (float *dinp, float *dwte, const float *dout, const float *inp, const float *wte, int N, int C,
             int V),
            (dinp, dwte, dout, inp, wte, N, C, V), REQUIRED)
/* GELU, tanh approximation (as GPT-2 and torch's approximate='tanh').
 * fwd writes out (n); bwd: dinp += gelu'(inp) * dout. */
LOOM_KERNEL(void, gelu_fwd, (float *out, const float *inp, size_t n), (out, inp, n), REQUIRED)
LOOM_KERNEL(void, gelu_bwd, (float *dinp, const float *inp, const float *dout, size_t n),
            (dinp, inp, dout, n), REQUIRED)
/* out = a + b (n). writes out; out may alias a or b. */
LOOM_KERNEL(void, residual_fwd, (float *out, const float *a, const float *b, size_t n), (out, a, b, n),
            REQUIRED)
/* da += dout; db += dout. */
LOOM_KERNEL(void, residual_bwd, (float *da, float *db, const float *dout, size_t n), (da, db, dout, n),
            REQUIRED)

/* ---- Llama-family block parts (llama_ops.c, cuda_llama.cu) --------------- */

/* RMSNorm: out (N,C) = inp * rstd * w, rstd (N) = 1 / sqrt(mean(inp^2) + eps)
 * per row. writes out, rstd. */
LOOM_KERNEL(void, rmsnorm_fwd,
            (float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps),
            (out, rstd, inp, w, N, C, eps), REQUIRED)
/* dinp (N,C) +=, dw (C) +=, from the saved rstd; either may be NULL. */
LOOM_KERNEL(void, rmsnorm_bwd,
            (float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
             int N, int C),
            (dinp, dw, dout, inp, w, rstd, N, C), REQUIRED)
/* A torch.nn.Linear: out (N,OC) = inp (N,C) @ w (OC,C)^T + b (OC), the
 * weight [out, in]. b may be NULL. writes out. */
LOOM_KERNEL(void, linear_fwd,
            (float *out, const float *inp, const float *w, const float *b, int N, int C, int OC),
            (out, inp, w, b, N, C, OC), REQUIRED)
/* dinp (N,C) += dout @ w; dw (OC,C) += dout^T @ inp; db (OC) += colsum(dout).
 * dinp, dw, db may be NULL. */
LOOM_KERNEL(void, linear_bwd,
            (float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w, int N,
             int C, int OC),
            (dinp, dw, db, dout, inp, w, N, C, OC), REQUIRED)
/* SwiGLU: each row of gu (N,2H) is [gate (H) | up (H)]; out (N,H) WRITES
 * silu(gate) * up, silu(g) = g / (1 + exp(-g)). */
LOOM_KERNEL(void, swiglu_fwd, (float *out, const float *gu, int N, int H), (out, gu, N, H), REQUIRED)
/* dgu (N,2H) WRITES the gradient of gu from dout (N,H). */
LOOM_KERNEL(void, swiglu_bwd, (float *dgu, const float *gu, const float *dout, int N, int H),
            (dgu, gu, dout, N, H), REQUIRED)
/* Rotary positions (Hugging Face's rotate_half convention), in place: on
 * each of the N rows of x (row stride ld) the heads h < nh of HS floats at
 * x + h*HS; for i < HS/2 with f = (float)pos[row] * inv_freq[i] (a float
 * product), (a, b) = (x_i, x_(i+HS/2)) becomes (a cos f - b sin f,
 * b cos f + a sin f). inverse = 1 rotates by -f: the backward. pos (N) and
 * inv_freq (HS/2) are device memory. */
LOOM_KERNEL(void, rope,
            (float *x, int ld, const int32_t *pos, const float *inv_freq, int N, int nh, int HS, int inverse),
            (x, ld, pos, inv_freq, N, nh, HS, inverse), REQUIRED)

/* ---- attention ----------------------------------------------------------- */

/* Causal multi-head self-attention with softmax scale 1/sqrt(HS), computed
 * with online softmax in blocks (attention.c): memory is O(T), never T x T.
 * qkv (B,T,3C) holds [q | k | v] along the last axis, each C = NH*HS laid out
 * head by head. Writes out (B,T,C) and lse (B,NH,T), each row's log-sum-exp
 * of its scaled scores, which is all the backward needs besides out. */
LOOM_KERNEL(void, attention_fwd, (float *out, float *lse, const float *qkv, int B, int T, int C, int NH),
            (out, lse, qkv, B, T, C, NH), REQUIRED)
/* dqkv (B,T,3C) += from dout (B,T,C), recomputing probabilities tile by tile. */
LOOM_KERNEL(void, attention_bwd,
            (float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int B,
             int T, int C, int NH),
            (dqkv, dout, qkv, out, lse, B, T, C, NH), REQUIRED)
/* out (b*o_bs + t*o_ld + h*HS ...) and lse (B,NH,Tq) WRITE the attention of
 * the queries to the visible keys of the view (kernel_types.h: loom_att_view;
 * rows that see none: out 0, lse -inf). accumulate = 1 continues from the
 * (out, lse) already there, as if its keys had been part of this view (same
 * result as loom_attention_merge of two parts). Returns the (query tile x key
 * tile) pairs computed, summed over batch and heads: the attention work done
 * (loom_attention_tiles, the CPU's count, on every backend). The view struct
 * is host memory, its q, k, v device memory. */
LOOM_KERNEL(long, attention_part_fwd,
            (const loom_att_view *v, float *out, size_t o_bs, int o_ld, float *lse, int accumulate),
            (v, out, o_bs, o_ld, lse, accumulate), REQUIRED)
/* dq (strides of q) +=, dk, dv (strides of k) += the view's share of the
 * gradient, given the FINAL out and lse of the queries (after all parts were
 * merged) and dout (out's strides). Returns the tiles computed. */
LOOM_KERNEL(long, attention_part_bwd,
            (const loom_att_view *v, float *dq, float *dk, float *dv, const float *dout, const float *out,
             size_t o_bs, int o_ld, const float *lse),
            (v, dq, dk, dv, dout, out, o_bs, o_ld, lse), REQUIRED)
/* (out, lse) = the merge of two partial results over disjoint key sets:
 * lse = log(e^lse + e^lse2), out = (e^lse out + e^lse2 out2) / e^lse_new. */
LOOM_KERNEL(void, attention_merge,
            (float *out, float *lse, const float *out2, const float *lse2, size_t o_bs, int o_ld, int B,
             int Tq, int NH, int HS),
            (out, lse, out2, lse2, o_bs, o_ld, B, Tq, NH, HS), REQUIRED)
/* Inference: n new query rows at positions p0 .. p0+n-1 of one sequence,
 * q (n, ldq) holding NH heads of HS = C/NH, against its cache kc, vc
 * (p0+n, NKV*HS) of NKV key/value heads (query head h reads kv head
 * h / (NH/NKV); NKV = NH without grouping) whose rows p0.. already hold the
 * new keys and values. Row i attends to positions 0 .. p0+i, only the last
 * window + 1 of them when window > 0 (as loom_att_view's window). Writes
 * out (n,C). scratch: loom_attention_kv_scratch_floats(n, p0+n) floats
 * (the GPU uses none: may be NULL there). */
LOOM_KERNEL(void, attention_kv_fwd,
            (float *out, const float *q, int ldq, const float *kc, const float *vc, int p0, int n, int C,
             int NH, int NKV, int window, float *scratch),
            (out, q, ldq, kc, vc, p0, n, C, NH, NKV, window, scratch), REQUIRED)

/* ---- vocabulary-parallel embedding and cross-entropy (kernels.h) -------- */

/* out (N,C) WRITES wte_l[tok - v0] for tokens in this rank's range, 0 else. */
LOOM_KERNEL(void, embed_fwd,
            (float *out, const int32_t *tok, const float *wte_l, int v0, int V_l, int N, int C),
            (out, tok, wte_l, v0, V_l, N, C), REQUIRED)
/* dwte_l (V_l,C) += dout rows of in-range tokens. */
LOOM_KERNEL(void, embed_bwd,
            (float *dwte_l, const float *dout, const int32_t *tok, int v0, int V_l, int N, int C),
            (dwte_l, dout, tok, v0, V_l, N, C), REQUIRED)
/* out (n,C) += wpe[(row0 + i) % T]: positions of rows row0 .. row0+n-1 of (B*T). */
LOOM_KERNEL(void, pos_fwd, (float *out, const float *wpe, int row0, int n, int T, int C),
            (out, wpe, row0, n, T, C), REQUIRED)
/* dwpe (maxT,C) += the same rows of dout (n,C). */
LOOM_KERNEL(void, pos_bwd, (float *dwpe, const float *dout, int row0, int n, int T, int C),
            (dwpe, dout, row0, n, T, C), REQUIRED)
/* rowmax (N) WRITES the max over the valid local columns (-inf if none). */
LOOM_KERNEL(void, vxent_max, (float *rowmax, const float *logits, int N, int V_l, int V_valid),
            (rowmax, logits, N, V_l, V_valid), REQUIRED)
/* logits (N,V_l) become exp(logit - gmax) (padding 0); rowsum (N) WRITES
 * their sum; tgt (N) WRITES logit[target] - gmax where the target is local, 0 else. */
LOOM_KERNEL(void, vxent_exp,
            (float *logits, float *rowsum, float *tgt, const float *gmax, const int32_t *targets, int v0,
             int N, int V_l, int V_valid),
            (logits, rowsum, tgt, gmax, targets, v0, N, V_l, V_valid), REQUIRED)
/* losses (N) WRITES log(gsum) - gtgt (0 for target < 0); probs /= gsum. */
LOOM_KERNEL(void, vxent_finish,
            (float *losses, float *probs, const float *gsum, const float *gtgt, const int32_t *targets, int N,
             int V_l),
            (losses, probs, gsum, gtgt, targets, N, V_l), REQUIRED)
/* dlogits (N,V_l) WRITES (probs - onehot(target)) * dloss (may alias probs);
 * rows with target < 0 get 0. */
LOOM_KERNEL(void, vxent_bwd,
            (float *dlogits, const float *probs, const int32_t *targets, float dloss, int v0, int N, int V_l),
            (dlogits, probs, targets, dloss, v0, N, V_l), REQUIRED)
/* The three phases max, exp, finish for a rank that holds the whole
 * vocabulary (no all-reduces between them; v0 = 0): logits (N,V_l) become
 * the probs and losses (N) WRITES the losses - the same floats as the three.
 * The CPU's makes one pass over the logits from memory instead of three. */
LOOM_KERNEL(void, vxent_local,
            (float *losses, float *logits, const int32_t *targets, int N, int V_l, int V_valid),
            (losses, logits, targets, N, V_l, V_valid), OPTIONAL)
/* vxent_local and vxent_bwd (v0 = 0) together, for a backward that follows
 * with this dloss: losses (N) WRITES the losses, and logits (N,V_l) is left
 * kept (gemm_keep) as the gradient (probs - onehot(target)) * dloss - the
 * same floats as the two kernels - for the head's backward products, until
 * the caller's gemm_unkeep. Read it only through those GEMMs: with a bf16
 * GEMM provider only the kept bf16 copy holds the gradient (the floats at
 * logits are left as they were). */
LOOM_KERNEL(void, vxent_local_grad,
            (float *losses, float *logits, const int32_t *targets, int N, int V_l, int V_valid, float dloss),
            (losses, logits, targets, N, V_l, V_valid, dloss), OPTIONAL)

/* ---- optimizer and whole-buffer helpers ---------------------------------- */

/* AdamW exactly as torch.optim.AdamW (decoupled decay, bias correction), on
 * the gradient scaled by gscale (the clip factor; 1 = unclipped):
 *   g' = g * gscale;  p *= 1 - lr*wd;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
 *   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 * t is the 1-based step count. g is only read: the same floats as scaling g
 * in place first (loom_scale) and updating with gscale 1, one pass fewer. */
LOOM_KERNEL(void, adamw_update,
            (float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
             float eps, float wd, int t, float gscale),
            (p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale), REQUIRED)
/* adamw_update (the same p, m, v), and g = 0 afterwards - the next step's
 * gradient zeroing in the same pass - and, unless p16 is NULL, the new p's
 * bf16 bits (bf16_pack's) at p16. */
LOOM_KERNEL(void, adamw_update_zero,
            (float *p, float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
             float wd, int t, float gscale, uint16_t *p16),
            (p, g, m, v, n, lr, beta1, beta2, eps, wd, t, gscale, p16), OPTIONAL)
/* Sum of squares in double (for gradient norms); the same double whatever
 * the thread count. A host value. */
LOOM_KERNEL(double, sumsq, (const float *x, size_t n), (x, n), REQUIRED)
/* x *= s. */
LOOM_KERNEL(void, scale, (float *x, size_t n, float s), (x, n, s), REQUIRED)
/* 1 if every x[i] is finite. */
LOOM_KERNEL(int, all_finite, (const float *x, size_t n), (x, n), REQUIRED)

/* ---- bf16 ------------------------------------------------------------------ */

/* dst[i] = src[i] rounded to bfloat16, kept as float (dst may be src). */
LOOM_KERNEL(void, round_bf16, (float *dst, const float *src, size_t n), (dst, src, n), REQUIRED)
/* dst[i] = the bf16 bits of src[i] rounded (loom/bf16.h), and back (exact),
 * on the device's own memory: what bf16 communication sends and receives
 * (dp.c, tp.c; a device communicator converts without a host round trip). */
LOOM_KERNEL(void, bf16_pack, (uint16_t * dst, const float *src, size_t n), (dst, src, n), REQUIRED)
LOOM_KERNEL(void, bf16_unpack, (float *dst, const uint16_t *src, size_t n), (dst, src, n), REQUIRED)

/* ---- kept GEMM operands (bf16 precision) -----------------------------------
 * The caller promises that the n floats at p do not change until
 * gemm_unkeep(p) (NULL: all), so every GEMM that reads any part of them may
 * use one bf16 conversion made at the first (the same values as converting
 * at each). At most eight at once on the CPU; a ninth is converted at every
 * use, as without keeping. No effect in fp32; a backend may ignore both. */
LOOM_KERNEL(void, gemm_keep, (const float *p, size_t n), (p, n), REQUIRED)
LOOM_KERNEL(void, gemm_unkeep, (const float *p), (p), REQUIRED)
/* A kept operand the caller writes itself: the buffer for the bf16 bits of
 * [src, src + n) (NULL when loom_gemm_keeps_bf16 is 0, or no slot or
 * memory), to be filled from the floats the caller has just stored at src;
 * then gemm_keep_filled(src, 1) - or 0 if it did not fill all of it. The
 * next gemm_keep(src, n) then uses those bits without converting; until
 * then a GEMM converts as usual. The optimizer writes the parameters' copy
 * as it updates them (dp.c). */
LOOM_KERNEL(loom_bf16_buf, gemm_keep_fill, (const float *src, size_t n), (src, n), REQUIRED)
LOOM_KERNEL(void, gemm_keep_filled, (const float *src, int ok), (src, ok), REQUIRED)

/* ---- small tensor ops ------------------------------------------------------ */

/* y[i] += x[i] */
LOOM_KERNEL(void, tensor_add, (float *y, const float *x, size_t n), (y, x, n), REQUIRED)
/* a[i] = b[i] = a[i] + b[i]: two copies of one tied tensor summed in both. */
LOOM_KERNEL(void, tensor_add2, (float *a, float *b, size_t n), (a, b, n), REQUIRED)
/* out (n,C) += res (n,C) + bias (C), summed as o + (r + b) */
LOOM_KERNEL(void, tensor_add_bias_residual, (float *out, const float *res, const float *bias, int n, int C),
            (out, res, bias, n, C), REQUIRED)
/* y (ncols) += column sums of the (N, ncols) block of x with row stride ld,
 * rows added in order 0..N-1 */
LOOM_KERNEL(void, tensor_colsum_acc, (float *y, const float *x, int N, int ld, int ncols),
            (y, x, N, ld, ncols), REQUIRED)
/* *host_acc += x[i] for i = 0..n-1 in order, in double (a loss sum) */
LOOM_KERNEL(void, tensor_sum_acc, (double *host_acc, const float *x, size_t n), (host_acc, x, n), REQUIRED)
/* x[i] = v */
LOOM_KERNEL(void, tensor_fill, (float *x, size_t n, float v), (x, n, v), REQUIRED)

/* ---- routing and row ops (MoE routing, dispatch and combine; CP row
 * permutations). Index lists (int32) are device memory too. ---- */

/* each row of x (N,n) replaced by its softmax (shifted by the row max; the
 * exponentials and their sum in double), lse[i] = max + log(sum); returns
 * the sum over rows, in order, of lse[i]^2 in double (host value) */
LOOM_KERNEL(double, tensor_softmax_lse, (float *x, float *lse, int N, int n), (x, lse, N, n), REQUIRED)
/* per row i of p (N,n), n <= LOOM_TOPK_MAX_N: sel (N,k) the k columns with
 * the largest p + bias (bias: n), best first, ties to the lower column;
 * gate (N,k) = p at them, divided by their sum (in choice order) if norm */
LOOM_KERNEL(void, tensor_topk_gate,
            (int32_t * sel, float *gate, const float *p, const float *bias, int N, int n, int k, int norm),
            (sel, gate, p, bias, N, n, k, norm), REQUIRED)
/* WRITES dx (N,n), the gradient of the logits of p = softmax: from dgate
 * (N,k) through topk_gate's gates (norm as there) into dp (N,n scratch),
 * plus add_scale * add_tab[add_row[i]] (add_tab: int32 rows of n, a
 * per-row table such as token counts), then through the softmax, plus
 * z_scale * lse[i] / N * p (a z-loss term) */
LOOM_KERNEL(void, tensor_topk_gate_bwd,
            (float *dx, float *dp, const float *dgate, const int32_t *sel, const float *gate, const float *p,
             const float *lse, const int32_t *add_tab, const int32_t *add_row, float add_scale, float z_scale,
             int N, int n, int k, int norm),
            (dx, dp, dgate, sel, gate, p, lse, add_tab, add_row, add_scale, z_scale, N, n, k, norm), REQUIRED)
/* dst row r = src row idx[r], r < n (rows of C floats; dst and src apart) */
LOOM_KERNEL(void, tensor_gather_rows, (float *dst, const float *src, const int32_t *idx, int n, int C),
            (dst, src, idx, n, C), REQUIRED)
/* dst row idx[r] += src row r, for r = 0..n-1 in order (repeated idx add up) */
LOOM_KERNEL(void, tensor_scatter_add_rows, (float *dst, const float *src, const int32_t *idx, int n, int C),
            (dst, src, idx, n, C), REQUIRED)
/* WRITES out (N,C): row i = sum over j < k in order, from 0, of
 * w[i k + j] * y row row[i k + j], skipping row < 0 */
LOOM_KERNEL(void, tensor_combine_rows,
            (float *out, const float *y, const int32_t *row, const float *w, int N, int k, int C),
            (out, y, row, w, N, k, C), REQUIRED)
/* combine_rows' backward: for row[i k + j] = r >= 0, dy row r = w[i k + j] *
 * dout row i and dw[i k + j] = dout row i . y row r (in column order);
 * dw = 0 where r < 0; dy rows no r names are left as they are */
LOOM_KERNEL(void, tensor_combine_rows_bwd,
            (float *dy, float *dw, const float *dout, const float *y, const int32_t *row, const float *w,
             int N, int k, int C),
            (dy, dw, dout, y, row, w, N, k, C), REQUIRED)
