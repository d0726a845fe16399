/* Number and time formats shared by the progress bar, console output and the metrics file. The
 * duration, SI and rate formats follow tqdm's format_interval / format_sizeof / rate_fmt so a bar
 * reads like the one users know from Python. */
#include <composer/report.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *put(char *buf, size_t cap, const char *s) {
    if (cap) snprintf(buf, cap, "%s", s);
    return buf;
}

char *cm_format_duration(double seconds, char *buf, size_t cap) {
    if (!(seconds >= 0) || isinf(seconds) || seconds >= 9.2e18) return put(buf, cap, "?");
    long long t = (long long)seconds;
    long long s = t % 60, mins = t / 60, m = mins % 60, h = mins / 60;
    if (h)
        snprintf(buf, cap, "%lld:%02lld:%02lld", h, m, s);
    else
        snprintf(buf, cap, "%02lld:%02lld", m, s);
    return buf;
}

char *cm_format_si(double x, char *buf, size_t cap) {
    if (isnan(x)) return put(buf, cap, "nan");
    if (isinf(x)) return put(buf, cap, x > 0 ? "inf" : "-inf");
    static const char *const units[] = {"", "k", "M", "G", "T", "P", "E", "Z"};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        double a = fabs(x);
        if (a < 999.5) {
            if (a < 99.95) {
                if (a < 9.995) snprintf(buf, cap, "%.2f%s", x, units[i]);
                else snprintf(buf, cap, "%.1f%s", x, units[i]);
            } else {
                snprintf(buf, cap, "%.0f%s", x, units[i]);
            }
            return buf;
        }
        x /= 1000.0;
    }
    snprintf(buf, cap, "%.1fY", x);
    return buf;
}

char *cm_format_rate(double units_per_s, const char *unit, bool si, char *buf, size_t cap) {
    char u[17];
    snprintf(u, sizeof u, "%s", unit ? unit : "it");
    if (!(units_per_s > 0) || isinf(units_per_s)) {
        snprintf(buf, cap, "?%s/s", u);
        return buf;
    }
    char num[CM_FORMAT_MAX];
    double inv = 1.0 / units_per_s;
    if (inv > 1.0) {
        if (si) cm_format_si(inv, num, sizeof num);
        else snprintf(num, sizeof num, "%.2f", inv);
        snprintf(buf, cap, "%ss/%s", num, u);
    } else {
        if (si) cm_format_si(units_per_s, num, sizeof num);
        else snprintf(num, sizeof num, "%.2f", units_per_s);
        snprintf(buf, cap, "%s%s/s", num, u);
    }
    return buf;
}

char *cm_format_metric(double x, char *buf, size_t cap) {
    if (isnan(x)) return put(buf, cap, "nan");
    if (isinf(x)) return put(buf, cap, x > 0 ? "inf" : "-inf");
    double a = fabs(x);
    if (a != 0 && (a < 0.01 || a >= 1e6))
        snprintf(buf, cap, "%.4e", x);
    else
        snprintf(buf, cap, "%.4f", x == 0 ? 0.0 : x);
    return buf;
}

int cm_format_double_shortest(double x, char *buf, size_t cap) {
    const char *special = isnan(x) ? "NaN" : isinf(x) ? (x > 0 ? "Infinity" : "-Infinity") : NULL;
    if (special) return snprintf(buf, cap, "%s", special);
    /* The fewest significant digits that read back exactly: %.17e always does; printf rounds
     * correctly, so the first precision that round-trips gives the shortest digit string. */
    char e[40];
    for (int prec = 0; prec <= 16; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, x);
        if (strtod(e, NULL) == x) break;
    }
    /* Split "-d.ddde+XX" into sign, digits and exponent. */
    const char *q = e;
    bool neg = *q == '-';
    if (neg) q++;
    char digits[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    /* Python's repr layout: positional for 1e-4 <= |x| < 1e16, else d.ddde+XX. */
    char out[48];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10 || i < nd; i++) {
                if (i == exp10 + 1) out[o++] = '.';
                out[o++] = i < nd ? digits[i] : '0';
            }
        } else {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%+03d", exp10);
    }
    return snprintf(buf, cap, "%s", out);
}
