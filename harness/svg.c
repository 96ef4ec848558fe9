/*
 * svg.c: the plots of svg.h, written by hand (no library): fixed canvas,
 * linear axes from the data's range, a handful of tick labels.
 */
#include "svg.h"

#include <math.h>
#include <string.h>

static const char *const COLORS[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                     "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

void svg_escape(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&apos;", out); break;
        default:
            /* XML 1.0 has no C0 controls but tab, newline, CR (not even as &#N;) */
            if (((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n' && *s != '\r') || *s == 0x7f)
                fprintf(out, "\\x%02x", (unsigned char)*s);
            else
                fputc(*s, out);
        }
    }
}

enum { W = 640, H = 320, L = 56, R = 16, T = 32, B = 48 };

static void frame(FILE *out, const char *title)
{
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                 "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">\n",
            W, H, W, H);
    fprintf(out, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(out, "<text x=\"%d\" y=\"18\" text-anchor=\"middle\" font-size=\"13\">", W / 2);
    svg_escape(out, title);
    fputs("</text>\n", out);
    fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B,
            W - R, H - B);
    fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L,
            H - B);
}

int svg_bars(FILE *out, const char *title, int n_groups, const char *const *labels, int n_series,
             const char *const *series, const double *values)
{
    double max = 0;
    for (int i = 0; i < n_groups * n_series; i++)
        if (isfinite(values[i]) && values[i] > max) max = values[i];
    if (max <= 0) max = 1;
    frame(out, title);
    double gw = (double)(W - L - R) / (n_groups > 0 ? n_groups : 1);
    double bw = gw * 0.8 / (n_series > 0 ? n_series : 1);
    for (int k = 0; k <= 4; k++) {
        double v = max * k / 4, y = H - B - (H - B - T) * (v / max);
        fprintf(out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 4, y + 4, v);
    }
    for (int g = 0; g < n_groups; g++) {
        double x0 = L + g * gw + gw * 0.1;
        for (int s = 0; s < n_series; s++) {
            double v = values[s * n_groups + g];
            if (!isfinite(v) || v <= 0) continue;
            double h = (H - B - T) * (v / max);
            fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">"
                         "<title>",
                    x0 + s * bw, H - B - h, bw > 1 ? bw - 1 : bw, h, COLORS[s % 8]);
            svg_escape(out, series[s]);
            fprintf(out, " %s: %.0f</title></rect>\n", labels[g], v);
        }
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", L + g * gw + gw / 2,
                H - B + 14);
        svg_escape(out, labels[g]);
        fputs("</text>\n", out);
    }
    for (int s = 0; s < n_series; s++) {
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                     "<text x=\"%d\" y=\"%d\">",
                L + 8 + s * 110, H - 18, COLORS[s % 8], L + 22 + s * 110, H - 9);
        svg_escape(out, series[s]);
        fputs("</text>\n", out);
    }
    fputs("</svg>\n", out);
    return ferror(out) ? -1 : 0;
}

int svg_scatter(FILE *out, const char *title, const char *xlabel, const char *ylabel, int n,
                const double *x, const double *y, const int *mark, double hline)
{
    double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    int any = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        if (!any) x0 = x1 = x[i], y0 = 0, y1 = y[i], any = 1;
        if (x[i] < x0) x0 = x[i];
        if (x[i] > x1) x1 = x[i];
        if (y[i] < y0) y0 = y[i];
        if (y[i] > y1) y1 = y[i];
    }
    if (isfinite(hline) && hline > y1) y1 = hline;
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1;
    frame(out, title);
#define PX(v) (L + (W - L - R) * (((v) - x0) / (x1 - x0)))
#define PY(v) (H - B - (H - B - T) * (((v) - y0) / (y1 - y0)))
    for (int k = 0; k <= 4; k++) {
        double v = y0 + (y1 - y0) * k / 4;
        fprintf(out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 4, PY(v) + 4, v);
        double u = x0 + (x1 - x0) * k / 4;
        fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", PX(u),
                H - B + 14, u);
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (W + L) / 2, H - 12);
    svg_escape(out, xlabel);
    fprintf(out, "</text>\n<text x=\"12\" y=\"%d\" transform=\"rotate(-90 12 %d)\" "
                 "text-anchor=\"middle\">", (H + T) / 2, (H + T) / 2);
    svg_escape(out, ylabel);
    fputs("</text>\n", out);
    if (isfinite(hline))
        fprintf(out, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#999\" "
                     "stroke-dasharray=\"4 3\"/>\n", L, PY(hline), W - R, PY(hline));
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i])) continue;
        double px = PX(x[i]), py = PY(y[i]);
        if (mark && mark[i])
            fprintf(out, "<path d=\"M%.1f %.1fl6 6m0 -6l-6 6\" stroke=\"#d62728\" "
                         "stroke-width=\"2\"/>\n", px - 3, py - 3);
        else
            fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"#555\"/>\n", px, py);
    }
#undef PX
#undef PY
    fputs("</svg>\n", out);
    return ferror(out) ? -1 : 0;
}
