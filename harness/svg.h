/*
 * svg.h: two small self-contained SVG plots for the markdown evidence file:
 * a grouped bar chart (the rank histogram per arm) and a scatter plot (the
 * reference gap per step, divergences marked). The SVG is written to a
 * FILE* as one element, no external styles, so it can be inlined in
 * markdown or saved beside it.
 *
 * Ownership: every pointer argument is borrowed for the call.
 */
#ifndef TG_SVG_H
#define TG_SVG_H

#include <stdio.h>

/* Grouped bars: n_groups categories (labels[g]) with n_series bars each;
 * value of series s in group g is values[s * n_groups + g]. Returns 0, or -1
 * when out reports a write error. */
int svg_bars(FILE *out, const char *title, int n_groups, const char *const *labels, int n_series,
             const char *const *series, const double *values);

/* Scatter: n points (x[i], y[i]); mark[i] != 0 draws the point as a red
 * cross (a divergence), else a grey dot. Non-finite y values are skipped.
 * Returns 0, or -1 on a write error. */
int svg_scatter(FILE *out, const char *title, const char *xlabel, const char *ylabel, int n,
                const double *x, const double *y, const int *mark, double hline);

/* Writes s with &, <, >, " and ' escaped for XML, and C0 control bytes
 * (but tab, newline, CR) and DEL as the text "\xNN" (XML cannot carry
 * them), so JUnit and SVG stay well-formed. */
void svg_escape(FILE *out, const char *s);

#endif
