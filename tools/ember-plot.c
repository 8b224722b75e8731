/*
 * ember-plot — training curves from ember-train's metrics files, as a PNG or SVG picture:
 *
 *   ember-plot [-o OUT.png|OUT.svg] [--size WxH] [--x step|epoch] [--title T] METRICS...
 *
 * METRICS are --metrics files (one row per epoch) and/or --metrics-steps files (a row every
 * --log-every), CSV or JSON lines, of a finished or a running run (a row still being written is
 * left out). The drawing is trainer/plot.c's, the same as ember-train --plot.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"

static void usage(FILE *f) {
    fprintf(f,
"usage: ember-plot [options] METRICS...\n"
"Draw the training curves of ember-train's --metrics (per epoch) and --metrics-steps (per\n"
"step) files, CSV or .jsonl, of a finished or a running run: three panels sharing the x axis,\n"
"train and validation loss (and the per-step loss), train and validation accuracy (MAE for\n"
"regression), and the learning rate; axes labelled, a legend beside each panel.\n"
"\n"
"  -o, --output FILE   the picture: .png or .svg (default curves.png)\n"
"  --size WxH          its size in pixels (default 1000x800; 200..10000 each)\n"
"  --x step|epoch      the x axis (default: step when a --metrics-steps file is given, else\n"
"                      epoch)\n"
"  --title TEXT        a title above the top panel\n"
"  --help\n"
"\n"
"Exit codes: 0 written; 1 a file could not be read or the picture not written; 2 usage.\n");
}

int main(int argc, char **argv) {
    plot_spec spec = {.path = "curves.png", .width = 1000, .height = 800, .x = PLOT_X_AUTO};
    enum { O_SIZE = 256, O_X, O_TITLE, O_HELP };
    static const struct option opts[] = {{"output", 1, 0, 'o'}, {"size", 1, 0, O_SIZE},
                                         {"x", 1, 0, O_X},      {"title", 1, 0, O_TITLE},
                                         {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:", opts, NULL)) != -1) {
        switch (c) {
        case 'o': spec.path = optarg; break;
        case O_SIZE: {
            int w, h;
            char extra;
            if (sscanf(optarg, "%dx%d%c", &w, &h, &extra) != 2 || w < 200 || h < 200 ||
                w > 10000 || h > 10000) {
                fprintf(stderr, "ember-plot: --size %s: expected WxH, each 200..10000 (e.g. "
                        "1000x800)\n", optarg);
                return 2;
            }
            spec.width = w, spec.height = h;
            break;
        }
        case O_X:
            if (!strcmp(optarg, "step")) spec.x = PLOT_X_STEP;
            else if (!strcmp(optarg, "epoch")) spec.x = PLOT_X_EPOCH;
            else {
                fprintf(stderr, "ember-plot: --x %s: expected step or epoch\n", optarg);
                return 2;
            }
            break;
        case O_TITLE: spec.title = optarg; break;
        case O_HELP: usage(stdout); return 0;
        case ':':
            fprintf(stderr, "ember-plot: %s needs a value (see --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "ember-plot: unknown option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind == argc) {
        fprintf(stderr, "ember-plot: no metrics file given (see --help)\n");
        return 2;
    }
    if (!plot_format(spec.path)) {
        fprintf(stderr, "ember-plot: -o %s: the name must end in .png or .svg\n", spec.path);
        return 2;
    }
    plot_data d = {0};
    char err[600];
    for (int i = optind; i < argc; i++) {
        if (!plot_read_file(&d, argv[i], err, sizeof err)) {
            fprintf(stderr, "ember-plot: %s\n", err);
            plot_data_free(&d);
            return 1;
        }
    }
    bool ok = plot_render(&d, &spec, err, sizeof err);
    plot_data_free(&d);
    if (!ok) {
        fprintf(stderr, "ember-plot: %s\n", err);
        return 1;
    }
    return 0;
}
