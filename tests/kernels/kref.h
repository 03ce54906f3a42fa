/* kref.h - shared helpers for the kernel tests: a seeded RNG, float/double
 * buffers, central finite differences of a double objective, and the error
 * measures the tests assert on.
 *
 * The pattern every test follows: run the float kernel; run a plain double
 * reference forward written in the test; compare forwards; then compare the
 * float backward with central differences of L = sum(out * R) evaluated
 * with the double reference.
 */
#ifndef LOOM_TESTS_KREF_H
#define LOOM_TESTS_KREF_H

#include <stddef.h>
#include <stdint.h>

/* Forward tolerance (float kernel vs double reference, max-norm relative). */
#define KR_FWD_TOL 1e-5
/* Backward tolerance (float kernel vs finite differences, max-norm relative). */
#define KR_BWD_TOL 1e-4

void kr_seed(uint64_t seed);
double kr_uniform(double lo, double hi);
int kr_randint(int n); /* in [0, n) */

/* Buffers from malloc; abort on failure (tests only). */
float *kr_floats(size_t n);
double *kr_doubles(size_t n);
float *kr_rand_floats(size_t n, double lo, double hi);
float *kr_copy(const float *x, size_t n);
double *kr_widen(const float *x, size_t n);
void kr_fill_nan(float *x, size_t n);
/* 1 when the n floats at a and b have the same bits. */
int kr_same_bits(const float *a, const float *b, size_t n);

/* max |a - b| / max |b| (0/0 counts as 0; NaN in a gives +inf). */
double kr_err(const float *a, const double *b, size_t n);
/* max |a - 2 b| / max |2 b|: a should be exactly twice b up to rounding. */
double kr_err_twice(const float *a, const float *b, size_t n);

/* The scalar objective: reads the double inputs the test set up in ctx. */
typedef double (*kr_objective)(void *ctx);

/* grad[i] = (f(x + h e_i) - f(x - h e_i)) / 2h for each of the n entries of
 * x, which the objective must read through ctx; x is restored afterwards.
 * h = 1e-5 * max(1, |x_i|). */
void kr_fd_grad(double *grad, double *x, size_t n, kr_objective f, void *ctx);

/* sum_i out[i] * r[i] */
double kr_dot(const double *out, const double *r, size_t n);

/* A gradient buffer under test. kr_acc_new fills g with random values and
 * keeps them as g0; the test runs the backward once, calls kr_acc_snap (g1 =
 * g), runs it a second time and calls kr_acc_check, which CHECKs that
 * g1 - g0 matches fd (the gradient of L) within KR_BWD_TOL and that
 * g - g0 = 2 (g1 - g0): backward accumulates and does not overwrite. */
typedef struct {
    float *g, *g0, *g1; /* (n) each */
    size_t n;
} kr_acc;

kr_acc kr_acc_new(size_t n);
void kr_acc_snap(kr_acc *a);
void kr_acc_check(const kr_acc *a, const double *fd, const char *what);
void kr_acc_free(kr_acc *a);

#endif
