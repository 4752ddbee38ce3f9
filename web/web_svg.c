/*
 * web/web_svg.c - the two drawings of the status page, written as SVG text
 * in C (no script, no library): the loss curve of a run as a line plot with
 * labelled axes, and a lineage graph as boxes in columns (runs, checkpoints,
 * exports, endpoints) joined by labelled curves. Every text goes through
 * web_esc; coordinates are numbers printed here.
 */
#include "web_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- line plot ----------------------------------------------------------------------- */

enum { PLOT_W = 720, PLOT_H = 280, PLOT_L = 64, PLOT_R = 16, PLOT_T = 16, PLOT_B = 44 };

/* A short label for an axis value that is a multiple of step. */
static void tick_label(char *buf, size_t n, double v, double step)
{
    double a = fabs(v);
    if (fabs(v) < step * 1e-9)
        v = 0.0, a = 0.0; /* -0.000 is 0 */
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (a != 0 && (a >= 1e7 || a < 1e-4))
        snprintf(buf, n, "%.2g", v);
    else
        snprintf(buf, n, "%.*f", decimals, v);
}

/* Round axis ticks over [*lo, *hi]: a step of 1, 2 or 5 times a power of
 * ten giving at most `most` intervals, and the range widened to multiples
 * of it. Returns the step. */
static double nice_axis(double *lo, double *hi, int most)
{
    double span = *hi - *lo;
    if (!(span > 0))
        span = fabs(*hi) > 0 ? fabs(*hi) : 1.0;
    double raw = span / most, mag = pow(10.0, floor(log10(raw))), step = mag;
    const double mult[] = {1, 2, 5, 10};
    for (size_t i = 0; i < 4; i++)
        if (mag * mult[i] >= raw - 1e-12 * raw) {
            step = mag * mult[i];
            break;
        }
    *lo = floor(*lo / step + 1e-9) * step;
    *hi = ceil(*hi / step - 1e-9) * step;
    if (*hi <= *lo)
        *hi = *lo + step;
    return step;
}

void web_svg_plot(web_buf_t *b, const double *x, const double *y, size_t n, const char *svg_id,
                  const char *x_label, const char *y_label)
{
    web_buf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"");
    web_esc(b, svg_id);
    web_buf_printf(b,
                   "\" class=\"plot\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                   "role=\"img\" aria-label=\"",
                   PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    web_esc(b, y_label);
    web_buf_puts(b, " by ");
    web_esc(b, x_label);
    web_buf_puts(b, "\">\n");
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i]))
            continue;
        x0 = fmin(x0, x[i]);
        x1 = fmax(x1, x[i]);
        y0 = fmin(y0, y[i]);
        y1 = fmax(y1, y[i]);
    }
    int pw = PLOT_W - PLOT_L - PLOT_R, ph = PLOT_H - PLOT_T - PLOT_B;
    web_buf_printf(b,
                   "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\" "
                   "stroke=\"#999\"/>\n",
                   PLOT_L, PLOT_T, pw, ph);
    if (!(x0 <= x1)) {
        web_buf_printf(b,
                       "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#666\">no points "
                       "yet</text>\n</svg>\n",
                       PLOT_L + pw / 2, PLOT_T + ph / 2);
        return;
    }
    /* A loss is never negative: the axis does not go below 0 when no point
     * does. */
    bool nonneg = y0 >= 0;
    double ypad = (y1 - y0) * 0.05;
    if (y1 == y0)
        ypad = fabs(y0) > 0 ? fabs(y0) * 0.1 : 0.5;
    y0 -= ypad;
    y1 += ypad;
    if (nonneg && y0 < 0)
        y0 = 0;
    double ystep = nice_axis(&y0, &y1, 5);
    if (nonneg && y0 < 0)
        y0 = 0;
    double xstep = nice_axis(&x0, &x1, 6);
    if (xstep < 1 && x0 == floor(x0))
        xstep = 1, x1 = ceil(x1); /* steps are whole numbers */
    for (double v = y0; v <= y1 + ystep * 1e-6; v += ystep) {
        char lab[32];
        double fy = PLOT_T + ph - (v - y0) / (y1 - y0) * ph;
        tick_label(lab, sizeof lab, v, ystep);
        web_buf_printf(b,
                       "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>"
                       "<text class=\"ytick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\" "
                       "font-size=\"11\">%s</text>\n",
                       PLOT_L, fy, PLOT_L + pw, fy, PLOT_L - 6, fy + 4, lab);
    }
    for (double v = x0; v <= x1 + xstep * 1e-6; v += xstep) {
        char lab[32];
        double fx = PLOT_L + (v - x0) / (x1 - x0) * pw;
        tick_label(lab, sizeof lab, v, xstep);
        web_buf_printf(b,
                       "<text class=\"xtick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" "
                       "font-size=\"11\">%s</text>\n",
                       fx, PLOT_T + ph + 16, lab);
    }
    web_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">",
                   PLOT_L + pw / 2, PLOT_H - 6);
    web_esc(b, x_label);
    web_buf_printf(b,
                   "</text><text x=\"14\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" "
                   "transform=\"rotate(-90 14 %d)\">",
                   PLOT_T + ph / 2, PLOT_T + ph / 2);
    web_esc(b, y_label);
    web_buf_printf(b, "</text>\n<polyline class=\"series\" data-points=\"%zu\" fill=\"none\" "
                      "stroke=\"#c0392b\" stroke-width=\"1.5\" points=\"",
                   n);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || !isfinite(y[i]))
            continue;
        double px = PLOT_L + (x[i] - x0) / (x1 - x0) * pw;
        double py = PLOT_T + ph - (y[i] - y0) / (y1 - y0) * ph;
        web_buf_printf(b, "%.1f,%.1f ", px, py);
    }
    web_buf_puts(b, "\"/>\n</svg>\n");
}

/* ---- lineage graph ------------------------------------------------------------------- */

enum { BOX_W = 230, BOX_H = 46, COL_GAP = 70, ROW_GAP = 22, MARGIN = 12 };

static const char *const node_fill[] = {
    [WEB_NODE_RUN] = "#e8f0fe", [WEB_NODE_CKPT] = "#fef7e0", [WEB_NODE_EXPORT] = "#f1f3f4",
    [WEB_NODE_ENDPOINT] = "#e6f4ea"};
static const char *const node_class[] = {
    [WEB_NODE_RUN] = "run", [WEB_NODE_CKPT] = "checkpoint", [WEB_NODE_EXPORT] = "export",
    [WEB_NODE_ENDPOINT] = "endpoint"};

static double box_x(const web_node_t *n)
{
    return MARGIN + n->col * (BOX_W + COL_GAP);
}

static double box_y(const web_node_t *n)
{
    return MARGIN + 14 + n->row * (BOX_H + ROW_GAP);
}

/* Copies s into out (cap bytes), ending in "..." when it does not fit. */
static void ellipsize(char *out, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (n < cap) {
        memcpy(out, s, n + 1);
        return;
    }
    memcpy(out, s, cap - 4);
    memcpy(out + cap - 4, "...", 4);
}

void web_svg_graph(web_buf_t *b, const web_graph_t *g, const char *svg_id)
{
    int rows = 1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].row + 1 > rows)
            rows = g->nodes[i].row + 1;
    int w = 2 * MARGIN + 4 * BOX_W + 3 * COL_GAP;
    int h = 2 * MARGIN + 14 + rows * (BOX_H + ROW_GAP);
    web_buf_puts(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"");
    web_esc(b, svg_id);
    web_buf_printf(b,
                   "\" class=\"lineage\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                   "role=\"img\" aria-label=\"lineage graph\">\n"
                   "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
                   "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 "
                   "L0,10 z\" fill=\"#666\"/></marker></defs>\n",
                   w, h, w, h);
    static const char *const heads[] = {"runs", "checkpoints", "exports", "endpoints"};
    for (int c = 0; c < 4; c++)
        web_buf_printf(b,
                       "<text x=\"%d\" y=\"%d\" font-size=\"12\" fill=\"#555\" "
                       "font-weight=\"bold\">%s</text>\n",
                       MARGIN + c * (BOX_W + COL_GAP), MARGIN + 4, heads[c]);
    for (int i = 0; i < g->nedges; i++) {
        const web_edge_t *e = &g->edges[i];
        const web_node_t *a = &g->nodes[e->from], *z = &g->nodes[e->to];
        double ax, ay, zx, zy, mx, my;
        bool holds = e->label[0] == 'h';
        const char *color = holds ? "#188038" : (e->label[0] == 'f' ? "#d93025" : "#666");
        web_buf_printf(b, "<g class=\"edge\"><path d=\"");
        if (a->col == z->col) {
            /* Within a column (base -> incremental): a bow on the left side. */
            ax = box_x(a);
            ay = box_y(a) + BOX_H / 2.0;
            zx = box_x(z);
            zy = box_y(z) + BOX_H / 2.0;
            mx = ax - 30;
            my = (ay + zy) / 2;
            web_buf_printf(b, "M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f", ax, ay, ax - 40, ay,
                           zx - 40, zy, zx, zy);
        } else {
            ax = box_x(a) + BOX_W;
            ay = box_y(a) + BOX_H / 2.0;
            zx = box_x(z);
            zy = box_y(z) + BOX_H / 2.0;
            double cx = (ax + zx) / 2;
            web_buf_printf(b, "M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f", ax, ay, cx, ay, cx,
                           zy, zx, zy);
            /* The label sits by the arrow head, where edges no longer cross. */
            mx = zx - 30;
            my = zy - 5;
        }
        web_buf_printf(b,
                       "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" "
                       "marker-end=\"url(#arrow)\"/><text x=\"%.1f\" y=\"%.1f\" "
                       "font-size=\"10\" text-anchor=\"middle\" fill=\"%s\">",
                       color, holds ? "2.5" : "1.2", mx, my, color);
        web_esc(b, e->label);
        web_buf_puts(b, "</text></g>\n");
    }
    for (int i = 0; i < g->nnodes; i++) {
        const web_node_t *n = &g->nodes[i];
        double x = box_x(n), y = box_y(n);
        web_buf_printf(b, "<g class=\"node %s\">", node_class[n->kind]);
        if (n->href[0]) {
            web_buf_puts(b, "<a href=\"");
            web_esc(b, n->href);
            web_buf_puts(b, "\">");
        }
        web_buf_printf(b,
                       "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" rx=\"6\" "
                       "fill=\"%s\" stroke=\"%s\" stroke-width=\"%s\"/>",
                       x, y, BOX_W, BOX_H, node_fill[n->kind], n->focus ? "#1a73e8" : "#999",
                       n->focus ? "2.5" : "1");
        /* Long titles are cut to fit the box; the full text is in <title>. */
        web_buf_printf(b, "<title>");
        web_esc(b, n->title);
        web_buf_puts(b, " - ");
        web_esc(b, n->detail);
        web_buf_printf(b, "</title><text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                          "font-weight=\"bold\">",
                       x + 8, y + 18);
        char cut[34];
        ellipsize(cut, sizeof cut, n->title);
        web_esc(b, cut);
        web_buf_printf(b, "</text><text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\">",
                       x + 8, y + 35);
        ellipsize(cut, sizeof cut, n->detail);
        web_esc(b, cut);
        web_buf_puts(b, "</text>");
        if (n->href[0])
            web_buf_puts(b, "</a>");
        web_buf_puts(b, "</g>\n");
    }
    if (g->nnodes == 0)
        web_buf_printf(b, "<text x=\"%d\" y=\"%d\" fill=\"#666\">nothing recorded yet</text>\n",
                       MARGIN, MARGIN + 40);
    web_buf_puts(b, "</svg>\n");
}
