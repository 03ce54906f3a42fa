/* report_svg.c - inline SVG charts for `loom report` (report_svg.h). */
#include "report_svg.h"

#include <math.h>
#include <string.h>

#define W 860.0
#define H 300.0
#define ML 80.0 /* margins: left, right, top, bottom */
#define MR 80.0
#define MT 34.0
#define MB 40.0

static const char *const COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                     "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_COLORS ((int)(sizeof COLORS / sizeof COLORS[0]))

void html_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void range(const double *v, int n, double *lo, double *hi) {
    *lo = INFINITY;
    *hi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) {
            *lo = v[i] < *lo ? v[i] : *lo;
            *hi = v[i] > *hi ? v[i] : *hi;
        }
    if (!isfinite(*lo)) *lo = 0, *hi = 1;
    if (*hi == *lo) {
        double d = *lo == 0 ? 1 : fabs(*lo) * 0.05;
        *lo -= d;
        *hi += d;
    }
}

static void open_svg(FILE *f, const char *id, const char *title, double h) {
    fprintf(
        f,
        "<svg id=\"%s\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
        "viewBox=\"0 0 %.0f %.0f\">\n<title>",
        id, W, h, W, h);
    html_text(f, title);
    fprintf(f, "</title>\n<text x=\"%.0f\" y=\"20\" class=\"t\">", ML);
    html_text(f, title);
    fputs("</text>\n", f);
}

/* Tick labels of an axis at x, values lo..hi mapped to the plot's height. */
static void axis(FILE *f, double x, double lo, double hi, const char *anchor, const char *label) {
    for (int k = 0; k <= 4; k++) {
        double v = lo + (hi - lo) * k / 4, y = H - MB - (H - MT - MB) * k / 4;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" class=\"a\">%.4g</text>\n", x, y + 4,
                anchor, v);
        if (strcmp(anchor, "end") == 0)
            fprintf(f, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" class=\"g\"/>\n", ML, W - MR, y,
                    y);
    }
    if (label && label[0]) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"%s\" class=\"a\">", x, MT - 8, anchor);
        html_text(f, label);
        fputs("</text>\n", f);
    }
}

void svg_lines(FILE *f, const char *id, const char *title, const double *x, int n, const svg_series *s,
               int n_series, const char *left_label, const char *right_label) {
    open_svg(f, id, title, H + 14.0 * n_series + 6); /* the legend below the plot, a row per series */
    double xl, xh, ll = INFINITY, lh = -INFINITY, rl = INFINITY, rh = -INFINITY;
    range(x, n, &xl, &xh);
    for (int k = 0; k < n_series; k++) {
        double lo, hi;
        range(s[k].y, n, &lo, &hi);
        double *a = s[k].right ? &rl : &ll, *b = s[k].right ? &rh : &lh;
        *a = lo < *a ? lo : *a;
        *b = hi > *b ? hi : *b;
    }
    if (!isfinite(ll)) ll = 0, lh = 1;
    axis(f, ML - 6, ll, lh, "end", left_label);
    if (isfinite(rl)) axis(f, W - MR + 6, rl, rh, "start", right_label);
    for (int k = 0; k <= 4; k++) /* x ticks */
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" class=\"a\">%.4g</text>\n",
                ML + (W - ML - MR) * k / 4, H - MB + 16, xl + (xh - xl) * k / 4);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" class=\"a\">step</text>\n",
            (ML + W - MR) / 2, H - 6);
    for (int k = 0; k < n_series; k++) {
        const double lo = s[k].right ? rl : ll, hi = s[k].right ? rh : lh;
        const char *color = COLORS[k % N_COLORS];
        fprintf(f, "<polyline class=\"series\" data-series=\"");
        html_text(f, s[k].name);
        fprintf(f, "\" data-axis=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s points=\"",
                s[k].right ? "right" : "left", color, s[k].right ? " stroke-dasharray=\"5 3\"" : "");
        for (int i = 0; i < n; i++)
            if (isfinite(s[k].y[i]))
                fprintf(f, "%.2f,%.2f ", ML + (W - ML - MR) * (x[i] - xl) / (xh - xl),
                        H - MB - (H - MT - MB) * (s[k].y[i] - lo) / (hi - lo));
        fputs("\" data-values=\"", f);
        for (int i = 0; i < n; i++)
            if (isfinite(s[k].y[i])) fprintf(f, "%s%.9g", i ? " " : "", s[k].y[i]);
        fputs("\"/>\n", f);
        /* legend, below the plot so it hides no line */
        double ly = H + 6 + 14 * k;
        fprintf(f,
                "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/>",
                ML, ML + 20, ly, ly, color, s[k].right ? " stroke-dasharray=\"5 3\"" : "");
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" class=\"a\">", ML + 24, ly + 4);
        html_text(f, s[k].name);
        fputs(s[k].right ? " (right axis)</text>\n" : "</text>\n", f);
    }
    fputs("</svg>\n", f);
}

void svg_bars(FILE *f, const char *id, const char *title, const char *const *labels, const double *v, int n,
              const char *label) {
    open_svg(f, id, title, H);
    double lo, hi;
    range(v, n, &lo, &hi);
    lo = lo > 0 ? 0 : lo;
    axis(f, ML - 6, lo, hi, "end", label);
    const double bw = (W - ML - MR) / (n > 0 ? n : 1);
    for (int i = 0; i < n; i++) {
        double y = H - MB - (H - MT - MB) * (v[i] - lo) / (hi - lo);
        fprintf(f,
                "<rect class=\"bar\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" "
                "data-value=\"%.9g\"><title>",
                ML + bw * i + 1, y, bw - 2, H - MB - y, COLORS[0], v[i]);
        html_text(f, labels[i]);
        fprintf(f, ": %.6g</title></rect>\n<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" class=\"a\">",
                v[i], ML + bw * (i + 0.5), H - MB + 14);
        html_text(f, labels[i]);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
}

void svg_timeline(FILE *f, const char *id, const char *title, const char *const *rows, int n_rows,
                  const svg_span *spans, int n) {
    static const char *const KIND_COLORS[] = {"#4c9be8", "#e8804c", "#7bc46b", "#b0b0b0", "#c9a0dc"};
    const double row_h = 22, h = MT + MB + row_h * n_rows;
    open_svg(f, id, title, h);
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        lo = spans[i].t0 < lo ? spans[i].t0 : lo;
        hi = spans[i].t1 > hi ? spans[i].t1 : hi;
    }
    if (!(hi > lo)) lo = 0, hi = 1;
    for (int r = 0; r < n_rows; r++) {
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" class=\"a\">", ML - 6,
                MT + row_h * r + 15);
        html_text(f, rows[r]);
        fputs("</text>\n", f);
    }
    for (int i = 0; i < n; i++) {
        const svg_span *s = &spans[i];
        double x0 = ML + (W - ML - MR) * (s->t0 - lo) / (hi - lo),
               x1 = ML + (W - ML - MR) * (s->t1 - lo) / (hi - lo);
        fprintf(f,
                "<rect class=\"span\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" "
                "data-row=\"%d\" data-t0=\"%.3f\" data-t1=\"%.3f\"><title>",
                x0, MT + row_h * s->row + 2, x1 - x0 > 0.5 ? x1 - x0 : 0.5, row_h - 4,
                KIND_COLORS[s->kind >= 0 && s->kind < 5 ? s->kind : 4], s->row, s->t0, s->t1);
        html_text(f, s->name);
        fprintf(f, " (%.1f us)</title></rect>\n", s->t1 - s->t0);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" class=\"a\">%.0f us</text>\n",
            (ML + W - MR) / 2, h - 10, hi - lo);
    fputs("</svg>\n", f);
}
