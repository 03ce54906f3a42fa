/* report_svg.h - the charts of `loom report` as inline SVG (report_svg.c):
 * line charts with a left and an optional right axis, bar charts, and a
 * timeline of rows of spans. Every plotted series also keeps its values in
 * a data-values attribute, so a test (or a reader) can check the picture
 * against the numbers. Local; writes to a FILE. */
#ifndef LOOM_REPORT_SVG_H
#define LOOM_REPORT_SVG_H

#include <stdio.h>

typedef struct svg_series {
    const char *name;
    const double *y; /* (n) NaN: no point */
    int right;       /* on the right axis */
} svg_series;

/* x (n) against each series; titles of the axes. */
void svg_lines(FILE *f, const char *id, const char *title, const double *x, int n, const svg_series *s,
               int n_series, const char *left_label, const char *right_label);

/* Bars: one per value, labels[i] under it. */
void svg_bars(FILE *f, const char *id, const char *title, const char *const *labels, const double *v, int n,
              const char *label);

typedef struct svg_span {
    int row;          /* 0 .. n_rows-1 */
    double t0, t1;    /* microseconds */
    const char *name; /* shown on hover */
    int kind;         /* colour: 0 forward, 1 backward, 2 weight, 3 communication, 4 other */
} svg_span;

void svg_timeline(FILE *f, const char *id, const char *title, const char *const *rows, int n_rows,
                  const svg_span *spans, int n);

/* s with &, <, >, " escaped for HTML text and attributes. */
void html_text(FILE *f, const char *s);

#endif
