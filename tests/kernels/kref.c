/* kref.c - helpers for the kernel tests; see kref.h. */
#include "kref.h"

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t kr_state = 0x9E3779B97F4A7C15ull;

void kr_seed(uint64_t seed) { kr_state = seed * 0x9E3779B97F4A7C15ull + 1; }

/* splitmix64 */
static uint64_t kr_next(void) {
    uint64_t z = (kr_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double kr_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(kr_next() >> 11) * (1.0 / 9007199254740992.0);
}

int kr_randint(int n) { return (int)(kr_next() % (uint64_t)n); }

static void *kr_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "kref: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

float *kr_floats(size_t n) { return kr_alloc(n * sizeof(float)); }
double *kr_doubles(size_t n) { return kr_alloc(n * sizeof(double)); }

float *kr_rand_floats(size_t n, double lo, double hi) {
    float *x = kr_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)kr_uniform(lo, hi);
    return x;
}

float *kr_copy(const float *x, size_t n) {
    float *y = kr_floats(n);
    memcpy(y, x, n * sizeof *y);
    return y;
}

double *kr_widen(const float *x, size_t n) {
    double *y = kr_doubles(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

void kr_fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

int kr_same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

double kr_err(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= num)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    if (num == 0) return 0;
    return num / (den > 1e-300 ? den : 1e-300);
}

double kr_err_twice(const float *a, const float *b, size_t n) {
    double *b2 = kr_doubles(n);
    for (size_t i = 0; i < n; i++) b2[i] = 2.0 * (double)b[i];
    double e = kr_err(a, b2, n);
    free(b2);
    return e;
}

void kr_fd_grad(double *grad, double *x, size_t n, kr_objective f, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        double h = 1e-5 * (fabs(x0) > 1 ? fabs(x0) : 1);
        x[i] = x0 + h;
        double fp = f(ctx);
        x[i] = x0 - h;
        double fm = f(ctx);
        x[i] = x0;
        grad[i] = (fp - fm) / (2 * h);
    }
}

double kr_dot(const double *out, const double *r, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += out[i] * r[i];
    return s;
}

kr_acc kr_acc_new(size_t n) {
    kr_acc a = {.g = kr_rand_floats(n, -0.5, 0.5), .g1 = kr_floats(n), .n = n};
    a.g0 = kr_copy(a.g, n);
    return a;
}

void kr_acc_snap(kr_acc *a) { memcpy(a->g1, a->g, a->n * sizeof *a->g); }

void kr_acc_check(const kr_acc *a, const double *fd, const char *what) {
    size_t n = a->n;
    float *d1 = kr_floats(n), *d2 = kr_floats(n);
    for (size_t i = 0; i < n; i++) {
        d1[i] = a->g1[i] - a->g0[i];
        d2[i] = a->g[i] - a->g0[i];
    }
    double e = kr_err(d1, fd, n), e2 = kr_err_twice(d2, d1, n);
    CHECK(e <= KR_BWD_TOL, "%s: backward vs finite differences: rel err %.3g", what, e);
    CHECK(e2 <= KR_FWD_TOL, "%s: second backward does not add the same again: rel err %.3g", what, e2);
    free(d1);
    free(d2);
}

void kr_acc_free(kr_acc *a) {
    free(a->g);
    free(a->g0);
    free(a->g1);
}
