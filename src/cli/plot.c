/* flexc plot DIR [DIR...] -o FILE.svg|FILE.png: the training and validation loss of each run
   (DIR/metrics.jsonl, as flexc train writes it) against the step, and its tokens/s in a
   second panel; several runs are overlaid, one colour each, with a legend. Drawn with cairo,
   which writes both formats; the extension of FILE picks one. See docs/plot.md. */
#include "cli.h"

#ifndef FLEXC_HAVE_CAIRO

int cmd_plot(int argc, char **argv)
{
    (void)argc, (void)argv;
    cli_error("plot: this flexc was built without cairo; install libcairo2-dev (scripts/deps.sh) and rebuild");
    return CLI_EXIT_FAIL;
}

#else

#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <fontconfig/fontconfig.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

enum { PLOT_MAX_RUNS = 16 };

/* ---- reading metrics.jsonl ------------------------------------------------------------ */

typedef struct series {
    double *x, *y; /* [n] step, value */
    size_t n, cap;
} series;

typedef struct run {
    char path[4096];  /* the metrics file */
    char label[64];   /* the legend's name of the run: its directory */
    series loss, val, tps, smooth;
} run;

static int series_push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

static void series_free(series *s)
{
    free(s->x), free(s->y);
}

static void run_free(run *r)
{
    series_free(&r->loss), series_free(&r->val), series_free(&r->tps), series_free(&r->smooth);
}

/* The legend's name of a run: the directory as given, without trailing slashes, its last
   components only when it is long. */
static void run_label(run *r, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    const char *s = dir;
    size_t cap = sizeof r->label - 1;
    if (n > cap) { /* keep the tail, from a '/' when there is one */
        s = dir + n - (cap - 3);
        const char *slash = memchr(s, '/', (size_t)(dir + n - s));
        if (slash && slash + 1 < dir + n)
            s = slash + 1;
        snprintf(r->label, sizeof r->label, "...%.*s", (int)(dir + n - s), s);
    } else
        snprintf(r->label, sizeof r->label, "%.*s", (int)n, s);
}

/* Field `key` of a metrics line: absent is fine (0), a number is stored (1), anything else
   is an error (-1). */
static int get_number(const json_t *obj, const char *key, double *v)
{
    const json_t *j = json_object_get(obj, key);
    if (!j)
        return 0;
    if (!json_is_number(j))
        return -1;
    *v = json_number_value(j);
    return 1;
}

/* Reads DIR/metrics.jsonl (or DIR itself when it is a file). A line that is not a JSON
   object, or whose step or values are not numbers, is an error naming its line, except an
   unfinished last line (no newline: a run writing it right now), which is left out with a
   note. Blank lines are skipped. */
/* r->path (DIR/metrics.jsonl, or the file given) and r's label. */
static int run_locate(run *r, const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        cli_error("plot: %s: %s", dir, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    if (S_ISDIR(st.st_mode))
        snprintf(r->path, sizeof r->path, "%s/metrics.jsonl", dir);
    else
        snprintf(r->path, sizeof r->path, "%s", dir);
    /* DIR/metrics.jsonl is named by DIR, as when DIR is given. */
    size_t n = strlen(dir), m = strlen("/metrics.jsonl");
    if (!S_ISDIR(st.st_mode) && n > m && !strcmp(dir + n - m, "/metrics.jsonl")) {
        char d[sizeof r->path];
        snprintf(d, sizeof d, "%.*s", (int)(n - m), dir);
        run_label(r, d);
    } else
        run_label(r, dir);
    return CLI_EXIT_OK;
}

/* The step, loss, validation loss and tokens/s of the object on line lineno into r's series:
   each optional, but a value needs its step, and each must be a number. */
static int run_record(run *r, const json_t *obj, long lineno)
{
    double step = 0, loss = 0, val = 0, tps = 0;
    int hs = get_number(obj, "step", &step), hl = get_number(obj, "loss", &loss);
    int hv = get_number(obj, "val_loss", &val), ht = get_number(obj, "tokens_per_s", &tps);
    const char *bad = hs < 0 ? "step" : hl < 0 ? "loss" : hv < 0 ? "val_loss" : ht < 0 ? "tokens_per_s" : NULL;
    if (!bad && hs == 0 && (hl > 0 || hv > 0 || ht > 0))
        bad = "step";
    if (bad) {
        cli_error("plot: %s: line %ld: '%s' is %s", r->path, lineno, bad, hs == 0 && !strcmp(bad, "step") ?
                  "missing" : "not a number");
        return CLI_EXIT_FAIL;
    }
    if ((hl > 0 && series_push(&r->loss, step, loss)) || (hv > 0 && series_push(&r->val, step, val)) ||
        (ht > 0 && series_push(&r->tps, step, tps))) {
        cli_error("plot: out of memory");
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* The lines of r->path (*lines: how many were read), a JSON object each; blank lines are
   skipped, and an unfinished last line after some objects (a run still writing) is left out. */
static int run_lines(run *r, FILE *f, long *lines)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0, objects = 0;
    int rc = CLI_EXIT_OK;
    while (rc == CLI_EXIT_OK && (len = getline(&line, &cap, f)) > 0) {
        lineno++;
        bool complete = line[len - 1] == '\n';
        if (strspn(line, " \t\r\n") == (size_t)len)
            continue;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--; /* so that a column in an error counts from the line's start */
        json_error_t jerr;
        json_t *obj = json_loadb(line, (size_t)len, 0, &jerr);
        if (!obj || !json_is_object(obj)) {
            json_decref(obj);
            if (!complete && objects > 0) {
                fprintf(stderr, "flexc: note: %s: line %ld is unfinished; left out\n", r->path, lineno);
                break;
            }
            if (obj)
                cli_error("plot: %s: line %ld: not a JSON object", r->path, lineno);
            else
                cli_error("plot: %s: line %ld: broken JSON: %s (column %d)", r->path, lineno, jerr.text,
                          jerr.column);
            rc = CLI_EXIT_FAIL;
            break;
        }
        objects++;
        rc = run_record(r, obj, lineno);
        json_decref(obj);
    }
    if (rc == CLI_EXIT_OK && ferror(f)) {
        cli_error("plot: cannot read %s: %s", r->path, strerror(errno));
        rc = CLI_EXIT_FAIL;
    }
    free(line);
    *lines = lineno;
    return rc;
}

static int run_read(run *r, const char *dir)
{
    int rc = run_locate(r, dir);
    if (rc != CLI_EXIT_OK)
        return rc;
    FILE *f = fopen(r->path, "r");
    if (!f) {
        cli_error("plot: cannot open %s: %s%s", r->path, strerror(errno),
                  errno == ENOENT ? " (is it a flexc train --out directory?)" : "");
        return CLI_EXIT_FAIL;
    }
    long lines = 0;
    rc = run_lines(r, f, &lines);
    fclose(f);
    if (rc != CLI_EXIT_OK)
        return rc;
    if (lines == 0) {
        cli_error("plot: %s is empty (the run has not finished a step yet?)", r->path);
        return CLI_EXIT_FAIL;
    }
    if (r->loss.n == 0) {
        cli_error("plot: %s: no 'loss' values in its %ld lines", r->path, lines);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

/* The mean of the w training losses around each step (fewer at the ends): the trend under
   the noise of single batches, centred so that it does not lag behind the data. */
static int run_smooth(run *r, int64_t w)
{
    size_t n = r->loss.n, h = (size_t)w / 2;
    double *c = malloc((n + 1) * sizeof *c); /* prefix sums */
    if (!c)
        return -1;
    c[0] = 0;
    for (size_t i = 0; i < n; i++)
        c[i + 1] = c[i] + r->loss.y[i];
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t a = i > h ? i - h : 0, b = i + h + 1 < n ? i + h + 1 : n;
        rc = series_push(&r->smooth, r->loss.x[i], (c[b] - c[a]) / (double)(b - a));
    }
    free(c);
    return rc;
}

/* ---- axes ------------------------------------------------------------------------------- */

typedef struct axis {
    double lo, hi;    /* data range shown (log10 of it when log) */
    bool log;
    bool decades;     /* log ticks at 1, 2, 5 x 10^k (else linear ticks, placed on the scale) */
    double ticks[32]; /* tick values (data units) */
    int nticks;
    double step;      /* linear tick spacing, for the labels' precision */
    bool kilo;        /* labels in thousands ("12k") */
} axis;

static double nice_step(double range, int target)
{
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

/* Linear ticks over [lo, hi], at least min_step apart; with `snap`, the range is widened to
   whole ticks. */
static void axis_linear(axis *a, double lo, double hi, int target, bool snap, double min_step)
{
    if (!(hi > lo)) {
        double d = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= d, hi += d;
    }
    a->log = a->decades = false;
    a->step = fmax(nice_step(hi - lo, target), min_step);
    if (snap) {
        lo = floor(lo / a->step + 1e-9) * a->step;
        hi = ceil(hi / a->step - 1e-9) * a->step;
    }
    a->lo = lo, a->hi = hi;
    a->nticks = 0;
    for (double t = ceil(lo / a->step - 1e-9) * a->step; t <= hi + a->step * 1e-9 && a->nticks < 32; t += a->step)
        a->ticks[a->nticks++] = fabs(t) < a->step * 1e-9 ? 0 : t;
    a->kilo = fmax(fabs(lo), fabs(hi)) >= 1e4;
}

/* Log ticks over [lo, hi] (both > 0): 1-2-5 in each decade when the range spans decades,
   else the linear ticks of the range placed on the log scale. */
static void axis_log(axis *a, double lo, double hi)
{
    lo *= 0.96, hi *= 1.04;
    if (hi / lo < 10) {
        axis_linear(a, lo, hi, 6, false, 0);
    } else {
        a->nticks = 0;
        a->step = pow(10, floor(log10(lo)));
        for (double dec = a->step; dec <= hi && a->nticks < 30; dec *= 10)
            for (int m = 0; m < 3; m++) {
                double t = dec * (m == 0 ? 1 : m == 1 ? 2 : 5);
                if (t >= lo && t <= hi && a->nticks < 32)
                    a->ticks[a->nticks++] = t;
            }
        a->kilo = hi >= 1e4;
        a->decades = true;
    }
    a->log = true;
    a->lo = log10(lo), a->hi = log10(hi);
}

static double axis_frac(const axis *a, double v)
{
    double x = a->log ? log10(v) : v;
    return (x - a->lo) / (a->hi - a->lo);
}

static void tick_label(char *buf, size_t n, const axis *a, double v)
{
    double scale = a->kilo ? 1e3 : 1, step = a->step / scale, x = v / scale;
    if (a->decades) {
        snprintf(buf, n, "%g%s", x, a->kilo ? "k" : "");
        return;
    }
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (v == 0) {
        snprintf(buf, n, "0");
        return;
    }
    snprintf(buf, n, "%.*f%s", dec > 6 ? 6 : dec, x, a->kilo ? "k" : "");
}

/* ---- drawing ---------------------------------------------------------------------------- */

typedef struct rgb {
    double r, g, b;
} rgb;

/* Colours told apart by most readers (Tableau 10). */
static const rgb palette[] = {
    {0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173}, {0.839, 0.153, 0.157},
    {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498},
    {0.737, 0.741, 0.133}, {0.090, 0.745, 0.812},
};
enum { PALETTE_N = sizeof palette / sizeof palette[0] };

typedef struct rect {
    double x, y, w, h;
} rect;

typedef struct plot {
    cairo_t *cr;
    double s; /* scale of sizes: 1 at 1200 x 800 */
    run *runs;
    int nruns;
} plot;

static void set_rgb(cairo_t *cr, rgb c, double alpha)
{
    cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha);
}

static void font(plot *p, double size, bool bold)
{
    cairo_select_font_face(p->cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(p->cr, size * p->s);
}

/* Text with its anchor at (x, y): ax, ay in [0, 1] from the left / top of the text. */
static void text(plot *p, double x, double y, double ax, double ay, const char *s)
{
    cairo_text_extents_t e;
    cairo_font_extents_t fe;
    cairo_text_extents(p->cr, s, &e);
    cairo_font_extents(p->cr, &fe);
    cairo_move_to(p->cr, x - ax * e.x_advance, y - ay * (fe.ascent + fe.descent) + fe.ascent);
    cairo_show_text(p->cr, s);
}

static double text_width(plot *p, const char *s)
{
    cairo_text_extents_t e;
    cairo_text_extents(p->cr, s, &e);
    return e.x_advance;
}

/* The frame, grid, ticks and labels of one panel; x labels only when `xlabels`. */
static void draw_axes(plot *p, rect r, const axis *ax, const axis *ay, const char *ylabel, bool xlabels)
{
    cairo_t *cr = p->cr;
    char buf[32];
    cairo_set_line_width(cr, 1);
    font(p, 13, false);
    for (int i = 0; i < ay->nticks; i++) {
        double y = r.y + r.h * (1 - axis_frac(ay, ay->ticks[i]));
        cairo_set_source_rgb(cr, 0.90, 0.90, 0.90);
        cairo_move_to(cr, r.x, y), cairo_line_to(cr, r.x + r.w, y), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
        cairo_move_to(cr, r.x - 5 * p->s, y), cairo_line_to(cr, r.x, y), cairo_stroke(cr);
        tick_label(buf, sizeof buf, ay, ay->ticks[i]);
        text(p, r.x - 8 * p->s, y, 1, 0.5, buf);
    }
    for (int i = 0; i < ax->nticks; i++) {
        double x = r.x + r.w * axis_frac(ax, ax->ticks[i]);
        cairo_set_source_rgb(cr, 0.90, 0.90, 0.90);
        cairo_move_to(cr, x, r.y), cairo_line_to(cr, x, r.y + r.h), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
        cairo_move_to(cr, x, r.y + r.h), cairo_line_to(cr, x, r.y + r.h + 5 * p->s), cairo_stroke(cr);
        if (xlabels) {
            tick_label(buf, sizeof buf, ax, ax->ticks[i]);
            text(p, x, r.y + r.h + 8 * p->s, 0.5, 0, buf);
        }
    }
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    cairo_rectangle(cr, r.x, r.y, r.w, r.h);
    cairo_stroke(cr);
    font(p, 15, false);
    cairo_save(cr);
    cairo_translate(cr, r.x - 62 * p->s, r.y + r.h / 2);
    cairo_rotate(cr, -M_PI / 2);
    text(p, 0, 0, 0.5, 0.5, ylabel);
    cairo_restore(cr);
    if (xlabels)
        text(p, r.x + r.w / 2, r.y + r.h + 30 * p->s, 0.5, 0, "step");
}

static void draw_series(plot *p, rect r, const axis *ax, const axis *ay, const series *s, rgb c, double alpha,
                        double width, bool dashed, bool markers)
{
    cairo_t *cr = p->cr;
    cairo_save(cr);
    cairo_rectangle(cr, r.x, r.y, r.w, r.h);
    cairo_clip(cr);
    set_rgb(cr, c, alpha);
    cairo_set_line_width(cr, width * p->s);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    if (dashed) {
        double d[2] = {7 * p->s, 4 * p->s};
        cairo_set_dash(cr, d, 2, 0);
    }
    bool pen = false;
    for (size_t i = 0; i < s->n; i++) {
        if (ay->log && !(s->y[i] > 0)) { /* not on a log scale: a gap */
            pen = false;
            continue;
        }
        double x = r.x + r.w * axis_frac(ax, s->x[i]), y = r.y + r.h * (1 - axis_frac(ay, s->y[i]));
        if (pen)
            cairo_line_to(cr, x, y);
        else
            cairo_move_to(cr, x, y);
        pen = true;
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
    if ((markers && s->n <= 200) || s->n == 1) /* a lone point is no line */
        for (size_t i = 0; i < s->n; i++) {
            if (ay->log && !(s->y[i] > 0))
                continue;
            double x = r.x + r.w * axis_frac(ax, s->x[i]), y = r.y + r.h * (1 - axis_frac(ay, s->y[i]));
            cairo_new_sub_path(cr);
            cairo_arc(cr, x, y, 3.5 * p->s, 0, 2 * M_PI);
            cairo_fill(cr);
        }
    cairo_restore(cr);
}

typedef struct entry {
    char label[96];
    rgb c;
    bool dashed, markers;
} entry;

/* The legend: one line per entry, in a box at the top right of the panel. */
static void draw_legend(plot *p, rect r, const entry *e, int n)
{
    cairo_t *cr = p->cr;
    font(p, 14, false);
    double wmax = 0, row = 22 * p->s, pad = 10 * p->s, sw = 34 * p->s;
    for (int i = 0; i < n; i++)
        wmax = fmax(wmax, text_width(p, e[i].label));
    double w = pad * 3 + sw + wmax, h = pad * 2 + row * n, x = r.x + r.w - w - 12 * p->s, y = r.y + 12 * p->s;
    cairo_rectangle(cr, x, y, w, h);
    cairo_set_source_rgba(cr, 1, 1, 1, 0.88);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.8, 0.8, 0.8);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    for (int i = 0; i < n; i++) {
        double cy = y + pad + row * (i + 0.5);
        set_rgb(cr, e[i].c, 1);
        cairo_set_line_width(cr, 2.2 * p->s);
        if (e[i].dashed) {
            double d[2] = {7 * p->s, 4 * p->s};
            cairo_set_dash(cr, d, 2, 0);
        }
        cairo_move_to(cr, x + pad, cy), cairo_line_to(cr, x + pad + sw, cy), cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        if (e[i].markers) {
            cairo_arc(cr, x + pad + sw / 2, cy, 3.5 * p->s, 0, 2 * M_PI);
            cairo_fill(cr);
        }
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        text(p, x + pad * 2 + sw, cy, 0, 0.5, e[i].label);
    }
}

typedef struct plot_opts {
    int64_t width, height, smooth;
    bool log;
    const char *title;
} plot_opts;

/* The ranges of the steps, losses and tokens/s over every run. */
typedef struct ranges {
    double x0, x1, y0, y1, t1;
    bool any_val, any_tps;
} ranges;

static ranges plot_ranges(const plot *p, bool log)
{
    ranges g = {INFINITY, -INFINITY, INFINITY, -INFINITY, 0, false, false};
    for (int k = 0; k < p->nruns; k++) {
        const run *r = &p->runs[k];
        const series *ss[2] = {&r->loss, &r->val};
        for (int j = 0; j < 2; j++)
            for (size_t i = 0; i < ss[j]->n; i++) {
                g.x0 = fmin(g.x0, ss[j]->x[i]), g.x1 = fmax(g.x1, ss[j]->x[i]);
                if (!log || ss[j]->y[i] > 0)
                    g.y0 = fmin(g.y0, ss[j]->y[i]), g.y1 = fmax(g.y1, ss[j]->y[i]);
            }
        for (size_t i = 0; i < r->tps.n; i++)
            g.x0 = fmin(g.x0, r->tps.x[i]), g.x1 = fmax(g.x1, r->tps.x[i]), g.t1 = fmax(g.t1, r->tps.y[i]);
        g.any_val |= r->val.n > 0;
        g.any_tps |= r->tps.n > 0;
    }
    if (!(g.y0 <= g.y1)) /* --log with no positive loss: nothing to draw on that scale */
        g.y0 = 0, g.y1 = 1;
    return g;
}

static void draw_title(plot *p, const plot_opts *o)
{
    font(p, 20, true);
    cairo_set_source_rgb(p->cr, 0.1, 0.1, 0.1);
    char title[128];
    if (o->title)
        snprintf(title, sizeof title, "%s", o->title);
    else if (p->nruns == 1)
        snprintf(title, sizeof title, "training run %s", p->runs[0].label);
    else
        snprintf(title, sizeof title, "%d training runs", p->nruns);
    text(p, (double)o->width / 2, 16 * p->s, 0.5, 0, title);
}

/* Every run's training (raw and smoothed) and validation loss in the panel rl, and their
   legend's entries into e; returns how many. One run: an entry per curve with its last value;
   several: one per run in its colour, then grey keys for the two kinds of curve. */
static int draw_losses(plot *p, rect rl, const axis *ax, const axis *ay, bool any_val, entry *e)
{
    const bool one = p->nruns == 1;
    int ne = 0;
    for (int k = 0; k < p->nruns; k++) {
        const run *r = &p->runs[k];
        rgb c = palette[k % PALETTE_N], cv = one ? palette[1] : c;
        bool smoothed = r->smooth.n > 0;
        draw_series(p, rl, ax, ay, &r->loss, c, smoothed ? 0.28 : 0.9, smoothed ? 1.0 : 1.6, false, false);
        if (smoothed)
            draw_series(p, rl, ax, ay, &r->smooth, c, 1, 2.2, false, false);
        draw_series(p, rl, ax, ay, &r->val, cv, 1, 2.2, true, true);
        double last = r->loss.y[r->loss.n - 1];
        if (one) {
            snprintf(e[ne].label, sizeof e[ne].label, "train loss (last %.3f)", smoothed ? r->smooth.y[r->smooth.n - 1] : last);
            e[ne].c = c, e[ne].dashed = e[ne].markers = false, ne++;
            if (r->val.n) {
                snprintf(e[ne].label, sizeof e[ne].label, "validation loss (last %.3f)", r->val.y[r->val.n - 1]);
                e[ne].c = cv, e[ne].dashed = e[ne].markers = true, ne++;
            }
        } else {
            if (r->val.n)
                snprintf(e[ne].label, sizeof e[ne].label, "%s (val %.3f)", r->label, r->val.y[r->val.n - 1]);
            else
                snprintf(e[ne].label, sizeof e[ne].label, "%s (train %.3f)", r->label,
                         smoothed ? r->smooth.y[r->smooth.n - 1] : last);
            e[ne].c = c, e[ne].dashed = e[ne].markers = false, ne++;
        }
    }
    if (!one) {
        rgb grey = {0.35, 0.35, 0.35};
        snprintf(e[ne].label, sizeof e[ne].label, "train");
        e[ne].c = grey, e[ne].dashed = e[ne].markers = false, ne++;
        if (any_val) {
            snprintf(e[ne].label, sizeof e[ne].label, "validation");
            e[ne].c = grey, e[ne].dashed = e[ne].markers = true, ne++;
        }
    }
    return ne;
}

static void draw(plot *p, const plot_opts *o)
{
    cairo_t *cr = p->cr;
    double W = (double)o->width, H = (double)o->height;
    p->s = fmin(W / 1200, H / 800);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);

    const ranges g = plot_ranges(p, o->log);
    axis ax, ay, at;
    axis_linear(&ax, g.x0, g.x1, 8, false, 1); /* steps are whole numbers */
    if (o->log && g.y0 > 0)
        axis_log(&ay, g.y0, g.y1);
    else
        axis_linear(&ay, g.y0 - (g.y1 - g.y0) * 0.04, g.y1 + (g.y1 - g.y0) * 0.04, 7, false, 0);
    axis_linear(&at, 0, g.t1 > 0 ? g.t1 * 1.05 : 1, 4, true, 0);

    /* Layout: a title, the loss panel, the tokens/s panel below it sharing the step axis. */
    double left = 96 * p->s, right = 28 * p->s, top = 58 * p->s, bottom = 62 * p->s, gap = 22 * p->s;
    double ph = H - top - bottom;
    rect rl = {left, top, W - left - right, g.any_tps ? (ph - gap) * 0.66 : ph};
    rect rt = {left, top + rl.h + gap, rl.w, ph - gap - rl.h};

    draw_title(p, o);
    draw_axes(p, rl, &ax, &ay, o->log ? "loss (log scale)" : "loss", !g.any_tps);
    entry e[PLOT_MAX_RUNS + 2];
    draw_legend(p, rl, e, draw_losses(p, rl, &ax, &ay, g.any_val, e));

    if (g.any_tps) {
        draw_axes(p, rt, &ax, &at, "tokens/s", true);
        for (int k = 0; k < p->nruns; k++)
            draw_series(p, rt, &ax, &at, &p->runs[k].tps, palette[k % PALETTE_N], 0.9, 1.4, false, false);
    }
}

/* ---- output ----------------------------------------------------------------------------- */

static cairo_status_t write_stream(void *closure, const unsigned char *data, unsigned int n)
{
    return fwrite(data, 1, n, closure) == n ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
}

static bool has_ext(const char *path, const char *ext)
{
    size_t n = strlen(path), e = strlen(ext);
    return n > e && !strcasecmp(path + n - e, ext);
}

/* Draws into FILE (SVG or PNG by its extension). A file that cannot be written completely is
   removed rather than left half-written. */
static int render(plot *p, const plot_opts *o, const char *path, bool svg)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        cli_error("plot: cannot write %s: %s", path, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    cairo_surface_t *surf;
    if (svg) {
        surf = cairo_svg_surface_create_for_stream(write_stream, f, (double)o->width, (double)o->height);
        cairo_svg_surface_set_document_unit(surf, CAIRO_SVG_UNIT_PX);
    } else
        surf = cairo_image_surface_create(CAIRO_FORMAT_RGB24, (int)o->width, (int)o->height);
    cairo_t *cr = cairo_create(surf);
    p->cr = cr;
    draw(p, o);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS && !svg)
        st = cairo_surface_write_to_png_stream(surf, write_stream, f);
    cairo_surface_finish(surf);
    if (st == CAIRO_STATUS_SUCCESS)
        st = cairo_surface_status(surf);
    cairo_surface_destroy(surf);
    errno = 0;
    int werr = ferror(f);
    if (fclose(f) != 0 || werr || st != CAIRO_STATUS_SUCCESS) {
        cli_error("plot: cannot write %s: %s", path,
                  st != CAIRO_STATUS_SUCCESS && st != CAIRO_STATUS_WRITE_ERROR ? cairo_status_to_string(st)
                  : errno ? strerror(errno) : "write error");
        unlink(path);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

int cmd_plot(int argc, char **argv)
{
    const char *out = NULL;
    plot_opts o = {.width = 1200, .height = 800, .smooth = -1};
    const cli_opt opts[] = {
        {"--output", CLI_STRING, &out, "the image to write, -o for short: FILE.svg or FILE.png"},
        {"--width", CLI_INT, &o.width, "image width in pixels (default 1200)"},
        {"--height", CLI_INT, &o.height, "image height in pixels (default 800)"},
        {"--log", CLI_FLAG, &o.log, "a logarithmic loss axis"},
        {"--smooth", CLI_INT, &o.smooth, "also draw the mean of the N training losses around each step (default: "
                                         "1/50 of the steps when there are over 100; 1: off)"},
        {"--title", CLI_STRING, &o.title, "the title (default: the run's directory)"},
    };
    const size_t nopts = sizeof opts / sizeof opts[0];
    const char *synopsis = "DIR [DIR...] -o FILE.svg|FILE.png [options]";
    /* -o is the one short option: the parser knows long names only. */
    char **args = malloc((size_t)(argc + 1) * sizeof *args);
    const char **pos = malloc((size_t)(argc + 1) * sizeof *pos);
    run *runs = NULL;
    int rc = CLI_EXIT_FAIL, npos = 0, nruns = 0;
    if (!args || !pos) {
        cli_error("plot: out of memory");
        goto done;
    }
    for (int i = 0; i < argc; i++)
        args[i] = !strcmp(argv[i], "-o") ? "--output" : argv[i];
    rc = cli_parse("plot", synopsis, argc, args, opts, nopts, pos, argc, &npos);
    if (rc == CLI_PARSE_HELP) {
        rc = CLI_EXIT_OK;
        goto done;
    }
    if (rc != CLI_PARSE_OK)
        goto done;
    rc = CLI_EXIT_USAGE;
    if (npos == 0 || !out) {
        cli_error("plot: %s", npos == 0 ? "expected at least one run directory" : "-o FILE.svg|FILE.png is required");
        cli_usage(stderr, "plot", synopsis, opts, nopts);
        goto done;
    }
    if (npos > PLOT_MAX_RUNS) {
        cli_error("plot: %d runs given; at most %d fit one plot", npos, PLOT_MAX_RUNS);
        goto done;
    }
    bool svg = has_ext(out, ".svg");
    if (!svg && !has_ext(out, ".png")) {
        cli_error("plot -o: '%s': the format follows the extension, .svg or .png", out);
        goto done;
    }
    if (o.width < 200 || o.width > 10000 || o.height < 200 || o.height > 10000) {
        cli_error("plot: --width %lld x --height %lld is outside [200, 10000] pixels", (long long)o.width,
                  (long long)o.height);
        goto done;
    }
    if (o.smooth == 0 || o.smooth < -1) {
        cli_error("plot --smooth: %lld is not a number of steps (1 or more; 1 is off)", (long long)o.smooth);
        goto done;
    }
    runs = calloc((size_t)npos, sizeof *runs);
    if (!runs) {
        cli_error("plot: out of memory");
        rc = CLI_EXIT_FAIL;
        goto done;
    }
    rc = CLI_EXIT_OK;
    for (; nruns < npos && rc == CLI_EXIT_OK; nruns++)
        rc = run_read(&runs[nruns], pos[nruns]);
    for (int k = 0; k < nruns && rc == CLI_EXIT_OK; k++) {
        int64_t w = o.smooth > 0 ? o.smooth : runs[k].loss.n > 100 ? (int64_t)runs[k].loss.n / 50 : 1;
        if (w > 1 && run_smooth(&runs[k], w)) {
            cli_error("plot: out of memory");
            rc = CLI_EXIT_FAIL;
        }
    }
    if (rc == CLI_EXIT_OK) {
        plot p = {.runs = runs, .nruns = nruns};
        rc = render(&p, &o, out, svg);
        /* cairo and fontconfig keep fonts cached for the process: give them back, so that a
           leak checker sees only what this command leaks. */
        cairo_debug_reset_static_data();
        FcFini();
    }
done:
    for (int k = 0; k < nruns; k++)
        run_free(&runs[k]);
    free(runs), free(args), free(pos);
    return rc;
}

#endif
